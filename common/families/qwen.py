"""Qwen2 (q/k/v bias, no o bias) and Qwen 3 (QK-norm: q and k RMS-normed per head before
RoPE); a sliding window on the layers from max_window_layers where use_sliding_window."""

from __future__ import annotations

from common.families.base import (
    LLAMA_LAYERS,
    QK_NORM_LAYERS,
    Family,
    GGUFSpec,
    LayerRecipe,
    decoder_args,
)

QWEN2 = Family(
    "qwen2",
    ("Qwen2ForCausalLM",),
    lambda hf: {**decoder_args(hf), "qkv_bias": True, "o_bias": False},
    sliding="qwen",
    gguf=GGUFSpec("qwen2", "qwen2", config=lambda read, cfg: {"attention_bias": True}),
)
QWEN3 = Family(
    "qwen3",
    ("Qwen3ForCausalLM",),
    decoder_args,
    recipe=LayerRecipe(qk_norm="head"),
    sliding="qwen",
    decode_style=("qk_norm",),
    gguf=GGUFSpec("qwen3", "qwen3", {**LLAMA_LAYERS, **QK_NORM_LAYERS}),
)
