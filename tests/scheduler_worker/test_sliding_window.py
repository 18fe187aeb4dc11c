"""Sliding-window attention over the paged KV cache equals transformers (float32), with
blocks before the window given back and prefix caching still right."""

from __future__ import annotations

import pytest
import torch

from common.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from common.sampling_params import SamplingParams
from scheduler_worker.models.common import layer_windows_of
from tests.conftest import hf_greedy, tiny_config

WINDOW = 7  # not a multiple of the block size (4): windows cut blocks in the middle
# longer than the window from the start, crossing it while decoding, one in between
PROMPTS = [list(range(20, 50)), [3, 4, 100, 200, 300], [9, 8, 7, 6, 5, 4, 3, 2, 1, 11, 12]]


@pytest.fixture(scope="module")
def mistral_window_dir(tmp_path_factory):
    from transformers import MistralForCausalLM

    config = tiny_config("MistralConfig", vocab_size=512, eos_token_id=2, sliding_window=WINDOW)
    torch.manual_seed(7)
    out = tmp_path_factory.mktemp("mistral_window")
    MistralForCausalLM(config).eval().save_pretrained(out)
    return out


def _config(model_dir, kernels="auto", **sched) -> EngineConfig:
    return EngineConfig(
        model=ModelConfig(model=str(model_dir), dtype="float32", kernels=kernels),
        cache=CacheConfig(block_size=4, num_blocks=64),
        scheduler=SchedulerConfig(**sched),
    )


def test_layer_windows_from_configs():
    assert layer_windows_of(
        {"num_hidden_layers": 2, "sliding_window": 5}, "MistralForCausalLM"
    ) == (
        5,
        5,
    )
    assert layer_windows_of({"num_hidden_layers": 2}, "MistralForCausalLM") == (None, None)
    qwen = {"num_hidden_layers": 3, "sliding_window": 5, "use_sliding_window": True}
    assert layer_windows_of({**qwen, "max_window_layers": 1}, "Qwen2ForCausalLM") == (None, 5, 5)
    assert (
        layer_windows_of({**qwen, "use_sliding_window": False}, "Qwen2ForCausalLM") == (None,) * 3
    )
    typed = {
        "num_hidden_layers": 2,
        "sliding_window": 4,
        "layer_types": ["sliding_attention", "full_attention"],
    }
    assert layer_windows_of(typed, "Gemma3ForCausalLM") == (4, None)


@pytest.mark.parametrize("kernels", ["auto", "torch"])
def test_mistral_window_engine_equals_transformers(mistral_window_dir, kernels):
    """Served by the engine (chunked prefill of 8 tokens, blocks given back past the
    window), the greedy tokens are transformers' own, with and without the C++ kernels."""
    from scheduler_worker.engine import LLMEngine

    engine = LLMEngine(
        _config(mistral_window_dir, kernels, max_num_batched_tokens=8), mistral_window_dir
    )
    assert engine.scheduler.sliding_window == WINDOW
    params = SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True)
    assert engine.generate(PROMPTS, params) == hf_greedy(mistral_window_dir, PROMPTS, 20)
    engine.block_manager.check_integrity()
    assert engine.block_manager.num_used_blocks == 0


def test_blocks_before_the_window_are_given_back_and_prefix_cache_hits(mistral_window_dir):
    """A 30-token prompt and 20 decodes hold 13 blocks without a window; with a window of
    7 a running request holds only the blocks its window and its hash chain still need.
    The same prompt again hits the prefix cache (its freed blocks kept their hashes) and
    still gives transformers' tokens."""
    from scheduler_worker.engine import LLMEngine

    engine = LLMEngine(_config(mistral_window_dir), mistral_window_dir)
    params = SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True)
    engine.add_request("a", PROMPTS[0], params)
    peak = 0
    while engine.has_unfinished():
        engine.step()
        peak = max(peak, engine.block_manager.num_used_blocks)
        engine.block_manager.check_integrity()
    assert peak <= 5  # window 7 + the block being written + the last hashed block
    expected = hf_greedy(mistral_window_dir, [PROMPTS[0]], 20)
    hits = engine.block_manager.prefix_cache_hits
    assert engine.generate([PROMPTS[0]], params) == expected
    assert engine.block_manager.prefix_cache_hits - hits >= 28


def test_the_default_kv_budget_grows_to_one_sequence_of_the_context():
    """Gemma 3's 32,768-token context needs 1.2 GB of float32 KV, more than the default
    1 GiB: the pool grows to hold one sequence (up to KV_GROW_LIMIT_GB), unless the user
    set the budget or the context, or the model needs more than the limit."""
    from types import SimpleNamespace

    from scheduler_worker.backends.base import Backend
    from scheduler_worker.model_runner import KV_GROW_LIMIT_GB, ModelRunner

    def blocks(context: int, per_token: int, **cfg) -> int:
        model = ModelConfig(max_model_len=cfg.pop("max_model_len", None))
        fake = SimpleNamespace(
            config=EngineConfig(model=model, cache=CacheConfig(block_size=16, **cfg)),
            args=SimpleNamespace(
                kv_bytes_per_token=lambda dtype: per_token,
                hf_config={"max_position_embeddings": context},
                num_kv_heads=1,
                head_dim=per_token,
                num_layers=1,
            ),
            model=None,
            vocab_size=1,
            dtype=torch.float32,
            kv_dtype=torch.float32,
            block_size=16,
            backend=Backend(torch.device("cpu"), torch.float32, 16),  # no profile: a budget
        )
        return ModelRunner._num_blocks(fake)  # type: ignore[arg-type]

    gemma = 18 * 2 * 256 * 4  # bytes per token: layers x (k, v) x head_dim x float32
    assert blocks(32768, gemma) == 32768 // 16  # grown: 1.13 GiB
    assert blocks(4096, gemma) == (1 << 30) // (gemma * 16)  # fits: the budget as is
    assert blocks(32768, gemma, kv_cache_memory_gb=0.5) == (1 << 29) // (gemma * 16)
    assert blocks(32768, gemma, max_model_len=32768) == (1 << 30) // (gemma * 16)
    huge = int(KV_GROW_LIMIT_GB * (1 << 30)) // 32768 + 1024  # one sequence past the limit
    assert blocks(32768, huge) == (1 << 30) // (huge * 16)
