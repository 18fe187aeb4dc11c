"""Models whose attention shapes the C++ decode ops once refused (more than 8 query heads
per KV head, unusual head sizes) are served, greedy equal to transformers; what the ops
cannot take is turned off at load with one log line, never at the first decode step."""

from __future__ import annotations

import logging

import pytest
import torch

from common.config import CacheConfig, EngineConfig, ModelConfig
from common.sampling_params import SamplingParams
from scheduler_worker import kernels
from scheduler_worker.kernels.shapes import decode_ops_refusal
from tests.conftest import hf_greedy

PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [3, 4, 100, 200, 300], [42], list(range(20, 60))]


def _tiny_llama(out, heads: int, kv_heads: int, head_dim: int):
    import transformers

    config = transformers.LlamaConfig(
        vocab_size=512,
        hidden_size=192,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        max_position_embeddings=512,
        initializer_range=0.1,
        eos_token_id=2,
    )
    torch.manual_seed(7)
    transformers.LlamaForCausalLM(config).eval().save_pretrained(out)
    return out


def _engine(model_dir, **model):
    from scheduler_worker.engine import LLMEngine

    cfg = EngineConfig(
        model=ModelConfig(model=str(model_dir), dtype="float32", device="cpu", **model),
        cache=CacheConfig(block_size=4, num_blocks=128),
    )
    return LLMEngine(cfg, model_dir)


GREEDY = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)


@pytest.mark.skipif(not kernels.load(), reason="the C++ kernels are not built here")
@pytest.mark.parametrize(
    "heads,kv_heads,head_dim",
    [(16, 1, 16), (12, 2, 40), (32, 2, 8)],  # 16, 6 and 16 query heads per KV head
)
@pytest.mark.parametrize("quantization", ["none", "int8"])
def test_many_query_heads_per_kv_head_decode_on_the_kernels(
    heads, kv_heads, head_dim, quantization, tmp_path
):
    src = _tiny_llama(tmp_path / "m", heads, kv_heads, head_dim)
    engine = _engine(src, quantization=quantization)
    assert engine.runner.decode_kernel == "paged" and engine.runner.kernel_isa is not None
    assert engine.sampler.kernel_isa == engine.runner.isa_index  # grammar masks: the C++ op
    got = engine.generate(PROMPTS, GREEDY)
    if quantization == "none":
        assert got == hf_greedy(src, PROMPTS, GREEDY.max_tokens)
    else:  # every linear on the kernels: decode steps in one C++ call, which must equal
        # the module path (8-bit activations keep it from transformers' float output)
        assert engine.runner.model.decode_plan is not None
        modules = _engine(src, quantization=quantization)
        modules.runner.model.decode_plan = None
        assert got == modules.generate(PROMPTS, GREEDY)


def test_what_the_decode_ops_cannot_take_is_named():
    assert decode_ops_refusal(16, 1, 64) is None and decode_ops_refusal(40, 8, 96) is None
    assert "do not split evenly" in (decode_ops_refusal(12, 5, 64) or "")
    assert "odd" in (decode_ops_refusal(8, 8, 33) or "")


@pytest.mark.skipif(not kernels.load(), reason="the C++ kernels are not built here")
def test_a_refused_shape_turns_the_ops_off_at_load_with_one_line(tmp_path, monkeypatch, caplog):
    from scheduler_worker.backends import select

    src = _tiny_llama(tmp_path / "m", 8, 2, 16)
    monkeypatch.setattr(select, "decode_ops_refusal", lambda h, kv, d: "a shape")
    with caplog.at_level(logging.WARNING):
        engine = _engine(src)
    lines = [r for r in caplog.records if "C++ decode ops off (a shape)" in r.getMessage()]
    assert len(lines) == 1
    runner = engine.runner
    assert runner.kernel_isa is None and runner.decode_kernel != "paged"
    assert engine.sampler.kernel_isa is None  # grammar masks: torch's path
    assert all(m.ops.kernel_isa is None for m in runner.model.modules() if hasattr(m, "ops"))
    assert engine.generate(PROMPTS, GREEDY) == hf_greedy(src, PROMPTS, GREEDY.max_tokens)
