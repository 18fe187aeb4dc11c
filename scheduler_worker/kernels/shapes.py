"""Which models the C++ decode ops (attention, rms_norm, silu_mul, rope_write_kv,
decode_layers) can serve, checked when the kernel path is chosen, at load: a shape they
cannot take turns them off with one log line (the model then runs its pure-torch
attention, norms and RoPE; the quantized linears keep their kernels), instead of a
scheduler that loads, reports healthy and fails at its first decode step.

The C++ side takes any number of query heads per KV head and any head size
(decode_attention.cpp); what it still needs is below, and it re-checks every call.
"""

from __future__ import annotations


def decode_ops_refusal(num_heads: int, num_kv_heads: int, head_dim: int) -> str | None:
    """Why the C++ decode ops cannot serve these attention shapes, or None when they can."""
    if num_heads < 1 or num_kv_heads < 1 or head_dim < 1:
        return f"{num_heads} query heads, {num_kv_heads} KV heads, head_dim {head_dim}"
    if num_heads % num_kv_heads:
        return f"{num_heads} query heads do not split evenly over {num_kv_heads} KV heads"
    if head_dim % 2:
        return f"head_dim {head_dim} is odd (RoPE rotates the head in two halves)"
    return None
