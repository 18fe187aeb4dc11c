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

from common.families.base import Family, LayerRecipe, decoder_args

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
    # transformers 5's rope_parameters, or the older rotary_pct / rotary_emb_base
    rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    theta = float(rope.get("rope_theta", hf.get("rotary_emb_base", 10000.0)))
    scaling = None if rope.get("rope_type", rope.get("type", "default")) == "default" else rope
    return {
        **decoder_args(hf, ("layer_norm_eps", 1e-5), attention_bias=True, partial_rotary=True),
        # one K/V head per head, whatever else its config carries
        "num_kv_heads": hf["num_attention_heads"],
        "head_dim": hf["hidden_size"] // hf["num_attention_heads"],
        "hidden_act": hf.get("hidden_act", "gelu"),
        "mlp_bias": True,
        "rotary_fraction": float(rope.get("partial_rotary_factor", hf.get("rotary_pct", 0.25))),
        "global_rope": (theta, scaling),
        "recipe": replace(RECIPE, parallel_residual=bool(hf.get("use_parallel_residual", True))),
    }


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
