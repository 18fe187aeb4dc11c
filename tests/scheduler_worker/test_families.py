"""Current model families (Gemma 3, Qwen 3, Phi-3): tiny random checkpoints served by the
engine over the paged KV cache equal transformers, token for token and in logits (float32)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from common.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from common.sampling_params import SamplingParams
from scheduler_worker.model_runner import ModelRunner, SeqInput
from tests.conftest import hf_greedy, kernels_built, tiny_config

# one prompt past the Gemma window (6) from the start, the others crossing it while decoding
PROMPTS = [list(range(20, 45)), [3, 4, 100, 200, 300], [7] * 9, [42]]
COMMON = dict(vocab_size=512, eos_token_id=2)  # over tests.conftest.TINY_SHAPE


def _gemma3():
    from transformers import Gemma3ForCausalLM

    config = tiny_config(
        "Gemma3TextConfig",
        **COMMON,
        num_hidden_layers=4,
        head_dim=16,
        layer_types=[
            "sliding_attention",
            "sliding_attention",
            "full_attention",
            "sliding_attention",
        ],
        sliding_window=6,
        query_pre_attn_scalar=24,  # not head_dim: the scale must come from it
        final_logit_softcapping=3.0,  # small enough to bend the random logits
        rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
            "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1_000_000.0},
        },
    )
    return Gemma3ForCausalLM(config)


def _qwen3():
    from transformers import Qwen3ForCausalLM

    # head_dim 32 != hidden / heads (16), as in the real Qwen 3 models
    return Qwen3ForCausalLM(tiny_config("Qwen3Config", **COMMON, head_dim=32))


def _phi3():
    from transformers import Phi3ForCausalLM

    # Phi-3 mini's configs carry a sliding window (2047); a short one here
    return Phi3ForCausalLM(tiny_config("Phi3Config", **COMMON, sliding_window=9, pad_token_id=0))


FAMILIES = {"gemma3": _gemma3, "qwen3": _qwen3, "phi3": _phi3}


@pytest.fixture(scope="module")
def family_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("families")
    dirs = {}
    for kind, make in FAMILIES.items():
        torch.manual_seed(99)
        model = make().eval()
        with torch.no_grad():  # norms start at 0 (Gemma) or 1: make them random
            for name, p in model.named_parameters():
                if "norm" in name:
                    p.normal_(0.0, 0.3).add_(0 if kind == "gemma3" else 1)
        model.save_pretrained(root / kind)
        dirs[kind] = root / kind
    return dirs


def _config(model_dir, kernels="auto") -> EngineConfig:
    return EngineConfig(
        model=ModelConfig(model=str(model_dir), dtype="float32", kernels=kernels),
        # float32 K/V: the comparisons with transformers are at 1e-4 (the default float16
        # cache moves logits by ~1e-3: tests/scheduler_worker/test_models.py)
        cache=CacheConfig(block_size=4, num_blocks=128, kv_cache_dtype="float32"),
        scheduler=SchedulerConfig(max_num_batched_tokens=16),
    )


@pytest.mark.parametrize("kind", sorted(FAMILIES))
def test_prefill_logits_equal_transformers(kind, family_dirs):
    import transformers

    model_dir = family_dirs[kind]
    ref = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    runner = ModelRunner(_config(model_dir), model_dir)
    prompt = PROMPTS[0]
    with torch.no_grad():
        expected = ref(torch.tensor([prompt])).logits[0, -1]
    got = runner.execute([SeqInput(prompt, 0, list(range(10)))])[0]
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("kind", sorted(FAMILIES))
@pytest.mark.parametrize("kernels", ["auto", "torch"])
def test_engine_greedy_equals_transformers(kind, kernels, family_dirs):
    """Chunked prefill (16-token steps) and batched decode past the windows."""
    from scheduler_worker.engine import LLMEngine

    model_dir = family_dirs[kind]
    engine = LLMEngine(_config(model_dir, kernels), model_dir)
    params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
    assert engine.generate(PROMPTS, params) == hf_greedy(model_dir, PROMPTS, 16)
    engine.block_manager.check_integrity()


def test_sixteen_query_heads_per_kv_head_serve_transformers_tokens(tmp_path):
    """16 query heads per KV head (once past the C++ decode kernel's limit, which now takes
    any ratio: kernels.shapes) load, decode and serve transformers' tokens."""
    from transformers import LlamaForCausalLM

    from scheduler_worker.engine import LLMEngine

    torch.manual_seed(3)
    config = tiny_config("LlamaConfig", **COMMON, num_key_value_heads=1)
    config.num_attention_heads = 16  # head_dim 4
    LlamaForCausalLM(config).eval().save_pretrained(tmp_path)
    engine = LLMEngine(_config(tmp_path), tmp_path)
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    assert engine.generate(PROMPTS, params) == hf_greedy(tmp_path, PROMPTS, 12)


def test_unservable_attention_shape_is_refused_at_load_in_one_line(tmp_path, family_dirs):
    import json
    import shutil

    from scheduler_worker.models import UnsupportedModelError

    for f in family_dirs["qwen3"].iterdir():
        shutil.copy(f, tmp_path / f.name)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["num_key_value_heads"] = 3  # 4 query heads cannot share 3 KV heads
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UnsupportedModelError, match="cannot be served: 4 query heads") as e:
        ModelRunner(_config(tmp_path), tmp_path)
    assert "\n" not in str(e.value)


@pytest.mark.skipif(not kernels_built(), reason="the C++ kernels are not built here")
def test_a_softcapped_head_leaves_the_argmax_to_the_logits(family_dirs):
    """Gemma's final softcap (tanh) can round distinct logits to one value, so its model
    never takes the argmax of the raw head outputs (CausalLM.greedy_tokens: None); without
    the cap the int8 head takes it, equal to the logits' argmax."""
    model_dir = family_dirs["gemma3"]
    cfg = _config(model_dir)
    cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, quantization="int8"))
    runner = ModelRunner(cfg, model_dir)
    seq = [SeqInput(PROMPTS[0], 0, list(range(10)))]
    assert runner.model.softcap is not None
    assert runner.execute(seq, argmax_vocab=10**6).dtype == torch.float32
    runner.model.softcap = None
    tokens = runner.execute(seq, argmax_vocab=10**6)
    assert tokens.dtype == torch.int64 and torch.equal(tokens, runner.execute(seq).argmax(-1))
