"""GPT-NeoX / Pythia (GPTNeoXForCausalLM): LayerNorm with bias, attention and a gate-less
GELU MLP side by side from one hidden state (use_parallel_residual; else the pre-norm
layout), RoPE on the first rotary_pct of each head, biases throughout. Its checkpoints
name their tensors their own way and fuse q / k / v per head ([q; k; v] of head 0, then
head 1, ...): `_weights` gives the llama layout's. The one-call C++ decode step knows
none of it: its layers run one by one."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import replace
from typing import Any

from common.families.base import Family, LayerRecipe

RECIPE = LayerRecipe(norm="layer_norm", parallel_residual=True, gated_mlp=False)
# checkpoint name piece -> the llama layout's (old checkpoints call lm_head embed_out)
NAMES = (
    ("gpt_neox.", ""),
    ("embed_in.", "embed_tokens."),
    ("final_layer_norm.", "norm."),
    ("embed_out.", "lm_head."),
    (".attention.query_key_value.", ".self_attn.qkv_proj."),
    (".attention.dense.", ".self_attn.o_proj."),
    (".mlp.dense_h_to_4h.", ".mlp.up_proj."),
    (".mlp.dense_4h_to_h.", ".mlp.down_proj."),
)


def _args(hf: dict) -> dict:
    heads, hidden = hf["num_attention_heads"], hf["hidden_size"]
    # transformers 5's rope_parameters, or the older rotary_pct / rotary_emb_base
    rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    theta = float(rope.get("rope_theta", hf.get("rotary_emb_base", 10000.0)))
    scaling = None if rope.get("rope_type", rope.get("type", "default")) == "default" else rope
    bias = bool(hf.get("attention_bias", True))
    return dict(
        vocab_size=hf["vocab_size"],
        hidden_size=hidden,
        intermediate_size=hf["intermediate_size"],
        num_layers=hf["num_hidden_layers"],
        num_heads=heads,
        num_kv_heads=heads,
        head_dim=hidden // heads,
        max_position_embeddings=hf.get("max_position_embeddings", 2048),
        norm_eps=hf.get("layer_norm_eps", 1e-5),
        hidden_act=hf.get("hidden_act", "gelu"),
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
        qkv_bias=bias,
        o_bias=bias,
        mlp_bias=True,
        rotary_fraction=float(rope.get("partial_rotary_factor", hf.get("rotary_pct", 0.25))),
        global_rope=(theta, scaling),
        recipe=replace(RECIPE, parallel_residual=bool(hf.get("use_parallel_residual", True))),
    )


def _weights(weights: Iterable[tuple[str, Any]], hf: dict) -> Iterator[tuple[str, Any]]:
    heads = hf["num_attention_heads"]
    for name, t in weights:
        if name.endswith((".attention.bias", ".attention.masked_bias")):
            continue  # old checkpoints' causal-mask buffers
        for theirs, ours in NAMES:
            name = name.replace(theirs, ours)
        if ".qkv_proj." in name:  # [q; k; v] per head -> all q rows, all k, all v
            t = t.reshape(heads, 3, -1, *t.shape[1:]).transpose(0, 1).reshape(t.shape)
        yield name, t


GPT_NEOX = Family(
    "gpt_neox",
    ("GPTNeoXForCausalLM",),
    _args,
    recipe=RECIPE,
    weights=_weights,
    decode_style=None,
)
