"""GPT-2: learned positions, LayerNorm, fused c_attn (scheduler_worker/models/gpt2.py)."""

from __future__ import annotations

from common.families.base import Family


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
    )


GPT2 = Family("gpt2", ("GPT2LMHeadModel",), _args, layers="gpt2", decode_style=None)
