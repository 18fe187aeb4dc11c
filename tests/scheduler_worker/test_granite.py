"""Granite 3, a family added as one file (common/families/granite.py) and one FAMILIES line:
a tiny random checkpoint with all four multipliers away from 1 serves transformers' logits
and greedy tokens (float32), from its safetensors and from a GGUF file written as
llama.cpp lays out `granite` (Q and K permuted, the multipliers as metadata), float and
Q8_0 (the file's own blocks, decoding module by module: no one-call C++ step for it)."""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import pytest
import torch

from common.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from common.model_files.model_source import resolve_model
from common.sampling_params import SamplingParams
from scheduler_worker.model_runner import ModelRunner, SeqInput
from scheduler_worker.quant.linear import QuantLinear
from tests.conftest import hf_greedy, hf_greedy_of, tiny_config
from tests.gguf_files import write_gguf

MULTIPLIERS = dict(
    embedding_multiplier=3.0,
    attention_multiplier=0.3,  # not head_dim ** -0.5 (0.25)
    residual_multiplier=0.4,
    logits_scaling=4.0,
)
PROMPTS = [list(range(20, 45)), [3, 4, 100, 200, 300], [7] * 9, [42]]


def _granite(vocab_size: int, tie: bool):
    from transformers import GraniteForCausalLM

    torch.manual_seed(11)
    config = tiny_config(
        "GraniteConfig",
        vocab_size=vocab_size,
        eos_token_id=2,
        bos_token_id=1,
        tie_word_embeddings=tie,
        **MULTIPLIERS,
    )
    model = GraniteForCausalLM(config).eval()
    with torch.no_grad():  # norms start at 1: make them random
        for name, p in model.named_parameters():
            if "norm" in name:
                p.normal_(1.0, 0.3)
    return model


def _config(model: str, quantization: str = "auto", kernels: str = "auto") -> EngineConfig:
    return EngineConfig(
        model=ModelConfig(model=model, dtype="float32", quantization=quantization, kernels=kernels),
        # float32 K/V: compared with transformers at 1e-4
        cache=CacheConfig(block_size=4, num_blocks=128, kv_cache_dtype="float32"),
        scheduler=SchedulerConfig(max_num_batched_tokens=16),
    )


@pytest.fixture(scope="module")
def granite_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("granite")
    _granite(512, tie=False).save_pretrained(path)
    return path


def test_prefill_logits_equal_transformers(granite_dir):
    import transformers

    ref = transformers.AutoModelForCausalLM.from_pretrained(granite_dir, dtype=torch.float32)
    runner = ModelRunner(_config(str(granite_dir)), granite_dir)
    assert runner.model.args.residual_multiplier == 0.4
    with torch.no_grad():
        expected = ref.eval()(torch.tensor([PROMPTS[0]])).logits[0, -1]
    got = runner.execute([SeqInput(PROMPTS[0], 0, list(range(10)))])[0]
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("kernels", ["auto", "torch"])
def test_engine_greedy_equals_transformers(kernels, granite_dir):
    """Chunked prefill (16-token steps) and batched decode; an int8 head (auto) takes the
    argmax itself, which the positive logits_scaling keeps."""
    from scheduler_worker.engine import LLMEngine

    engine = LLMEngine(_config(str(granite_dir), kernels=kernels), granite_dir)
    params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
    assert engine.generate(PROMPTS, params) == hf_greedy(granite_dir, PROMPTS, 16)


def _write_gguf(model, path: Path, qtype: gguf.GGMLQuantizationType | None) -> Path:
    """As llama.cpp writes a granite file: Q and K permuted, the multipliers as metadata."""
    cfg = model.config

    def extra(w: gguf.GGUFWriter) -> None:
        w.add_key_length(cfg.hidden_size // cfg.num_attention_heads)
        w.add_embedding_scale(cfg.embedding_multiplier)
        w.add_attention_scale(cfg.attention_multiplier)
        w.add_residual_scale(cfg.residual_multiplier)
        w.add_logit_scale(cfg.logits_scaling)

    return write_gguf(model, "granite", path, qtype, permute_qk=True, extra=extra)


def test_a_granite_gguf_converts_and_serves_like_the_source_model(tmp_path):
    model = _granite(49152, tie=True)  # the default model's tokenizer goes in the file
    path = _write_gguf(model, tmp_path / "tiny-granite.gguf", None)
    model_dir = resolve_model(str(path), cache_dir=tmp_path / "cache", progress=False)
    config = json.loads((model_dir / "config.json").read_text())
    assert config["architectures"] == ["GraniteForCausalLM"]
    assert {k: config[k] for k in MULTIPLIERS} == pytest.approx(MULTIPLIERS)
    runner = ModelRunner(_config(str(path), quantization="none"), model_dir)
    with torch.no_grad():
        expected = model(torch.tensor([PROMPTS[0]])).logits[0, -1]
    got = runner.execute([SeqInput(PROMPTS[0], 0, list(range(10)))])[0]
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


def test_a_q8_0_granite_gguf_serves_from_its_blocks(tmp_path):
    """Every decoder linear a kernel QuantLinear over the file's blocks; no one-call C++
    step (Granite's decode_style is None: the op has no residual multiplier); the logits
    within 8-bit noise of transformers' and the greedy tokens equal to the float path's."""
    from scheduler_worker.engine import LLMEngine

    model = _granite(49152, tie=True)
    path = _write_gguf(model, tmp_path / "q8-granite.gguf", gguf.GGMLQuantizationType.Q8_0)
    model_dir = resolve_model(str(path), cache_dir=tmp_path / "cache", progress=False)
    runner = ModelRunner(_config(str(path), quantization="gguf"), model_dir)
    for layer in runner.model.layers:
        assert isinstance(layer.self_attn.qkv_proj, QuantLinear)
        assert isinstance(layer.mlp.down_proj, QuantLinear)
    assert runner.model.decode_plan is None
    with torch.no_grad():
        expected = model(torch.tensor([PROMPTS[0]])).logits[0, -1]
    got = runner.execute([SeqInput(PROMPTS[0], 0, list(range(10)))])[0]
    assert torch.nn.functional.cosine_similarity(got, expected, dim=0) > 0.999
    engine = LLMEngine(_config(str(path), quantization="gguf"), model_dir)
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    tokens = engine.generate(PROMPTS[:2], params)
    assert tokens == hf_greedy_of(model, PROMPTS[:2], 8)
