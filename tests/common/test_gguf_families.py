"""GGUF conversion of the qwen3 and phi3 architectures: tiny random transformers models
written as llama.cpp lays them out (Qwen 3's per-head q/k norms; Phi-3's fused attn_qkv and
ffn_up), converted, and served: logits equal the source model's; with Q8_0 linears, the
file's own blocks map onto every linear."""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import pytest
import torch

from common.config import CacheConfig, EngineConfig, ModelConfig
from common.model_files.model_source import resolve_model
from scheduler_worker.model_runner import ModelRunner, SeqInput
from scheduler_worker.quant.linear import QuantLinear
from tests.gguf_files import write_gguf

SHAPE = dict(
    vocab_size=49152,  # the default model's tokenizer goes in the file
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=1024,
    initializer_range=0.1,
    bos_token_id=1,
    eos_token_id=2,
)
# HF module -> GGUF tensor, per architecture (llama.cpp's convert_hf_to_gguf names)
NAMES = {
    "qwen3": {
        "q_proj": "attn_q",
        "k_proj": "attn_k",
        "v_proj": "attn_v",
        "o_proj": "attn_output",
        "q_norm": "attn_q_norm",
        "k_norm": "attn_k_norm",
        "gate_proj": "ffn_gate",
        "up_proj": "ffn_up",
        "down_proj": "ffn_down",
        "input_layernorm": "attn_norm",
        "post_attention_layernorm": "ffn_norm",
    },
    "phi3": {
        "qkv_proj": "attn_qkv",
        "o_proj": "attn_output",
        "gate_up_proj": "ffn_up",
        "down_proj": "ffn_down",
        "input_layernorm": "attn_norm",
        "post_attention_layernorm": "ffn_norm",
    },
}
PROMPT = list(range(100, 140))


def _tiny(arch: str):
    from transformers import Phi3Config, Phi3ForCausalLM, Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(5)
    if arch == "qwen3":
        model = Qwen3ForCausalLM(Qwen3Config(head_dim=32, tie_word_embeddings=True, **SHAPE))
    else:
        model = Phi3ForCausalLM(
            Phi3Config(sliding_window=24, tie_word_embeddings=False, pad_token_id=0, **SHAPE)
        )
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.normal_(1.0, 0.3)
    return model.eval()


def _head_dim(cfg) -> int:
    return getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads


def _write(model, arch: str, path: Path, qtype: gguf.GGMLQuantizationType | None) -> Path:
    cfg = model.config

    def extra(w: gguf.GGUFWriter) -> None:
        w.add_key_length(_head_dim(cfg))
        w.add_value_length(_head_dim(cfg))
        if getattr(cfg, "sliding_window", None):
            w.add_sliding_window(cfg.sliding_window)

    return write_gguf(model, arch, path, qtype, names=NAMES[arch], extra=extra)


@pytest.mark.parametrize("arch", ["qwen3", "phi3"])
def test_gguf_converts_and_serves_like_the_source_model(arch, tmp_path):
    model = _tiny(arch)
    path = _write(model, arch, tmp_path / f"tiny-{arch}.gguf", None)
    model_dir = resolve_model(str(path), cache_dir=tmp_path / "cache", progress=False)
    config = json.loads((model_dir / "config.json").read_text())
    assert config["architectures"] == [type(model).__name__]
    assert config["head_dim"] == _head_dim(model.config)
    assert config.get("sliding_window") == getattr(model.config, "sliding_window", None)
    runner = ModelRunner(
        EngineConfig(
            model=ModelConfig(model=str(path), dtype="float32", quantization="none"),
            # float32 K/V: compared with transformers at 1e-4 (float16 moves logits ~1e-3)
            cache=CacheConfig(block_size=4, num_blocks=64, kv_cache_dtype="float32"),
        ),
        model_dir,
    )
    with torch.no_grad():
        expected = model(torch.tensor([PROMPT])).logits[0, -1]
    got = runner.execute([SeqInput(PROMPT, 0, list(range(10)))])[0]
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("arch", ["qwen3", "phi3"])
def test_gguf_blocks_map_onto_every_linear(arch, tmp_path):
    """A Q8_0 file of each family is served from its own blocks: every decoder linear (and
    an untied head) is a kernel QuantLinear of the model's shape, none falls back, and the
    logits stay close to the dequantized float path's (8-bit activations: not exact)."""
    model = _tiny(arch)
    path = _write(model, arch, tmp_path / f"q8-{arch}.gguf", gguf.GGMLQuantizationType.Q8_0)
    model_dir = resolve_model(str(path), cache_dir=tmp_path / "cache", progress=False)

    def runner(quantization: str) -> ModelRunner:
        return ModelRunner(
            EngineConfig(
                model=ModelConfig(model=str(path), dtype="float32", quantization=quantization),
                cache=CacheConfig(block_size=4, num_blocks=64),
            ),
            model_dir,
        )

    served = runner("gguf")
    a = model.config
    q_rows = (a.num_attention_heads + 2 * a.num_key_value_heads) * _head_dim(a)
    for layer in served.model.layers:
        qkv, gate_up = layer.self_attn.qkv_proj, layer.mlp.gate_up_proj
        assert isinstance(qkv, QuantLinear) and isinstance(gate_up, QuantLinear)
        assert isinstance(layer.self_attn.o_proj, QuantLinear)
        assert isinstance(layer.mlp.down_proj, QuantLinear)
        assert (qkv.out_features, qkv.in_features) == (q_rows, a.hidden_size)
        assert gate_up.out_features == 2 * a.intermediate_size
    if not a.tie_word_embeddings:
        assert isinstance(served.model.lm_head, QuantLinear)
    got = served.execute([SeqInput(PROMPT, 0, list(range(10)))])[0]
    want = runner("none").execute([SeqInput(PROMPT, 0, list(range(10)))])[0]
    # 8-bit activations against float: the same logits up to quantization noise
    assert torch.nn.functional.cosine_similarity(got, want, dim=0) > 0.999
    assert (got - want).abs().max() < 0.25 and int(got.argmax()) == int(want.argmax())
