"""A decoder layer's operations, one set per device backend.

A model's layers call `self.ops.<op>` and never ask which device they are on:

    op              TorchOps (reference, any device)    CpuKernelOps (C++)      TritonOps (CUDA)
    linear          F.linear itself                     (TorchOps)              measured GEMV <= 8 rows
    rms_norm        float32 torch                       zeroserve.rms_norm      triton_ops.rms_norm
    act_mul         torch activation * up               silu_mul / gelu_tanh    triton_ops.act_mul
    rope_inputs     (cos, sin) per token                (positions, f32 tables) (positions, tables)
    rope_write_kv   rotate + index_copy into the cache  zeroserve.rope_write_kv triton_ops.rope_write_kv
    write_kv        index_copy into the cache           (TorchOps)              (TorchOps, masked)
    attention       attention.paged_attention           (TorchOps: C++ paged)   triton_decode/_prefill

The backend sets `ops` on every module that has the attribute (ModelRunner). TorchOps is the
test oracle: a faster op set must give the same outputs from the same inputs, within its
dtype's rounding. Every op's contract is TorchOps'; rope_write_kv and write_kv write the new
K/V into the paged cache at `meta.slot_mapping` before `attention` reads it, so a prompt
chunk attends its own tokens and everything cached before it.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from scheduler_worker.activations import ACTIVATIONS, GELU_TANH_ACTS
from scheduler_worker.attention import AttentionMetadata, paged_attention, write_kv
from scheduler_worker.rope import RotaryEmbedding, rotate

KVCache = tuple[torch.Tensor, torch.Tensor]


class TorchOps:
    """The reference: plain torch on any device (the attention of attention.py)."""

    name = "torch"
    kernel_isa: int | None = None  # the C++ kernels' path; None: not the C++ op set
    # the dtype of the residual stream (the running hidden state between layers) where it
    # is wider than the model's: None keeps it in the model's dtype, as transformers does
    residual_dtype: torch.dtype | None = None
    # a decode step's layers may run as one C++ call (models/decode_plan.py)
    one_call_decode = False
    # a dense layer's product (`Linear` below): F.linear itself, no wrapper, so the CPU's
    # call costs what nn.Linear's does; TritonOps routes a few rows to its GEMV
    linear = staticmethod(F.linear)

    def fp8_matmul(
        self, x: torch.Tensor, qw: torch.Tensor, sw: torch.Tensor, bias: torch.Tensor | None
    ) -> torch.Tensor | None:
        """x [M, K] times an E4M3 weight qw [N, K] with row scales sw [N, 1] on FP8 tensor
        cores, in x's dtype; None where the op set has none (quant/fp8.py emulates it)."""
        return None

    def rms_norm(
        self,
        x: torch.Tensor,
        residual: torch.Tensor | None,
        weight: torch.Tensor,
        eps: float,
        weight_offset: float = 0.0,
        out_dtype: torch.dtype | None = None,
    ) -> torch.Tensor:
        """norm(x), or with a residual stream: residual += x (in place), norm(residual).
        The output has out_dtype, else x's dtype: a float32 residual takes a bfloat16 x
        exactly and gives a bfloat16 norm. weight_offset 1.0 is Gemma's x * (1 + w),
        computed in float32."""
        dtype = out_dtype or x.dtype
        if residual is not None:
            x = residual.add_(x)
        y = x.float()
        y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + eps)
        if weight_offset:
            return (y * (weight_offset + weight.float())).to(dtype)
        return weight * y.to(dtype)

    def act_mul(self, gate_up: torch.Tensor, act: str) -> torch.Tensor:
        """act(gate) * up, gate and up the two halves of gate_up's last dim."""
        gate, up = gate_up.chunk(2, dim=-1)
        return ACTIVATIONS[act](gate) * up

    def rope_inputs(self, rope: RotaryEmbedding, positions: torch.Tensor, dtype: torch.dtype):
        """What rope_write_kv takes for this step's tokens, computed once for all layers."""
        return rope.cos_sin(positions, dtype)

    def rope_write_kv(
        self,
        qkv: torch.Tensor,
        rope: Any,
        kv_cache: KVCache,
        meta: AttentionMetadata,
        num_heads: int,
        num_kv_heads: int,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Rotate q and k (rotate-half RoPE) and write k, v into the cache at
        meta.slot_mapping. qkv [T, (H + 2 Hkv) D]; returns q [T, H, D], k and v [T, Hkv, D]."""
        t = qkv.shape[0]
        head_dim = kv_cache[0].shape[-1]
        q_size, kv_size = num_heads * head_dim, num_kv_heads * head_dim
        qk = rotate(qkv[:, : q_size + kv_size].view(t, -1, head_dim), *rope)
        q, k = qk[:, :num_heads], qk[:, num_heads:]
        v = qkv[:, q_size + kv_size :].view(t, num_kv_heads, head_dim)
        self.write_kv(k, v, kv_cache, meta)
        return q, k, v

    def write_kv(
        self, k: torch.Tensor, v: torch.Tensor, kv_cache: KVCache, meta: AttentionMetadata
    ) -> None:
        write_kv(kv_cache[0], kv_cache[1], k, v, meta.slot_mapping)

    def attention(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv_cache: KVCache,
        meta: AttentionMetadata,
        scale: float,
        window: int | None = None,
    ) -> torch.Tensor:
        """Attention of q [T, H, D] over the cache (k, v of this step already written)."""
        return paged_attention(
            q, k, v, kv_cache[0], kv_cache[1], meta, scale, kv_written=True, window=window
        )


class CpuKernelOps(TorchOps):
    """The C++ kernels (scheduler_worker/kernels) on one ISA path: fused add + RMSNorm,
    SiLU / GELU-tanh times up, RoPE with the K/V write in one pass, and (through
    attention.py, AttentionMetadata.decode_kernel "paged") the paged decode attention."""

    name = "cpu-kernels"

    def __init__(self, isa: int, one_call_decode: bool = True) -> None:
        self.kernel_isa = isa
        # the one-call op attends with the paged kernel: not where the CPU's decode
        # attention is a torch path (CpuBackend, ZEROSERVE_DECODE_ATTENTION)
        self.one_call_decode = one_call_decode

    def rms_norm(self, x, residual, weight, eps, weight_offset=0.0, out_dtype=None):
        mixed = out_dtype not in (None, x.dtype) or (
            residual is not None and residual.dtype != x.dtype
        )
        if weight_offset or mixed:
            return super().rms_norm(x, residual, weight, eps, weight_offset, out_dtype)
        return torch.ops.zeroserve.rms_norm(x, residual, weight, eps, self.kernel_isa)

    def act_mul(self, gate_up, act):
        if act in ("silu", "swish"):
            return torch.ops.zeroserve.silu_mul(gate_up, self.kernel_isa)
        if act in GELU_TANH_ACTS:
            return torch.ops.zeroserve.gelu_tanh_mul(gate_up, self.kernel_isa)
        return super().act_mul(gate_up, act)

    def rope_inputs(self, rope, positions, dtype):
        if not rope.table:  # computed per step (no tables): the torch path
            return super().rope_inputs(rope, positions, dtype)
        return (positions, *rope.tables_f32())  # the kernel reads float32 tables

    def rope_write_kv(self, qkv, rope, kv_cache, meta, num_heads, num_kv_heads):
        if len(rope) == 2:  # (cos, sin) of a rope without tables
            return super().rope_write_kv(qkv, rope, kv_cache, meta, num_heads, num_kv_heads)
        q, k = torch.ops.zeroserve.rope_write_kv(
            qkv,
            *rope,
            kv_cache[0],
            kv_cache[1],
            meta.slot_mapping,
            num_heads,
            num_kv_heads,
            self.kernel_isa,
        )
        t, head_dim = qkv.shape[0], kv_cache[0].shape[-1]
        v = qkv[:, (num_heads + num_kv_heads) * head_dim :].view(t, num_kv_heads, head_dim)
        return q, k, v


TORCH_OPS = TorchOps()


class Linear(nn.Linear):
    """nn.Linear whose product is the op set's `linear` (the backend sets `ops`, as on
    every layer module): the models' dense projections, so a model file never names a
    device's matmul (TritonOps: the few-row GEMV where it measured faster)."""

    ops: TorchOps = TORCH_OPS

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ops.linear(x, self.weight, self.bias)
