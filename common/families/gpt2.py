"""GPT-2 (GPT2LMHeadModel): learned positions, LayerNorm with bias, a gate-less GELU-tanh
MLP, the head tied to the embeddings. Its checkpoints name tensors their own way and store
the projections as Conv1D ([in, out]): `_weights` gives the llama layout's."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from common.families.base import Family, LayerRecipe

# checkpoint name piece -> the llama layout's
NAMES = (
    ("wte.", "embed_tokens."),
    ("wpe.", "embed_positions."),
    (".ln_1.", ".input_layernorm."),
    (".ln_2.", ".post_attention_layernorm."),
    (".attn.c_attn.", ".self_attn.qkv_proj."),
    (".attn.c_proj.", ".self_attn.o_proj."),
    (".mlp.c_fc.", ".mlp.up_proj."),
    (".mlp.c_proj.", ".mlp.down_proj."),
    ("ln_f.", "norm."),
)
_CONV1D = ("qkv_proj.weight", "o_proj.weight", "up_proj.weight", "down_proj.weight")


def _args(hf: dict) -> dict:
    n_embd = hf.get("n_embd", 768)
    n_head = hf.get("n_head", 12)
    return dict(
        vocab_size=hf["vocab_size"],
        hidden_size=n_embd,
        intermediate_size=hf.get("n_inner") or 4 * n_embd,
        num_layers=hf.get("n_layer", 12),
        num_heads=n_head,
        num_kv_heads=n_head,
        head_dim=n_embd // n_head,
        max_position_embeddings=hf.get("n_positions", 1024),
        norm_eps=hf.get("layer_norm_epsilon", 1e-5),
        hidden_act=hf.get("activation_function", "gelu_new"),
        tie_word_embeddings=True,
        qkv_bias=True,
        o_bias=True,
        mlp_bias=True,
        rotary_fraction=0.0,
    )


def _weights(weights: Iterable[tuple[str, Any]], hf: dict) -> Iterator[tuple[str, Any]]:
    for name, t in weights:
        if name.endswith((".attn.bias", ".attn.masked_bias")):
            continue  # old checkpoints' causal-mask buffers
        name = name.removeprefix("transformer.")
        if name.startswith("h."):
            name = "layers." + name.removeprefix("h.")
        for theirs, ours in NAMES:
            name = name.replace(theirs, ours)
        yield name, (t.t() if name.endswith(_CONV1D) else t)


GPT2 = Family(
    "gpt2",
    ("GPT2LMHeadModel",),
    _args,
    recipe=LayerRecipe(norm="layer_norm", gated_mlp=False, learned_positions=True),
    weights=_weights,
    decode_style=None,
)
