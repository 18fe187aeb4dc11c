"""Weight-only int8 / int4 linear layers: fewer weight bytes per decode step on the CPU.

At small batch a decode step is weight-bound: every token reads every weight once, and a
bf16 GEMV on a CPU without AMX streams weights at ~10 GB/s (docs/benchmarks.md). torch
ships CPU kernels that read int8 (`_weight_int8pack_mm`, per-output-channel scales) and
int4 (`_weight_int4pack_mm_for_cpu`, asymmetric groups of 32 along the input dim, the
layout of GGUF's Q4_1) weights and dequantize in registers: 2-3x fewer bytes per token.

Those kernels lose to the dense bf16 GEMM once a step has more than a few rows (the
dequantization is paid per row block, AMX/AVX512-BF16 GEMMs are not), so a layer keeps
both: the packed weight for steps of at most `max_rows` rows (decode of a few streams)
and a dense copy of the *dequantized* weight for the rest (prefill, large decode
batches). Both paths compute with the same weight values, so a request's tokens do not
depend on which path its step took beyond the rounding that batch size already changes.
Memory: the dense copy plus 1/2 (int8) or ~1/3 (int4 + group scales) of it.

The int4 format is exact for weights that came from a Q4_1 GGUF: each group of 32 is
`d * q + m` with q in 0..15, its min is m (q = 0) and its max m + 15d, so re-deriving the
group's scale and minimum recovers d, m and q.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

QUANT_METHODS = ("none", "int8", "int4")
INT4_GROUP_SIZE = 32
# Rows (tokens) per step up to which the packed kernels run. Measured on both CPU kinds
# of docs/benchmarks.md ("Weight-only quantization"): int4 beats dense bf16 up to 4-8
# rows and loses 2x at 32.
DEFAULT_MAX_ROWS = 4


def quantize_int8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric per-output-channel int8: w ~= q * scale[:, None]. Returns (q, scale)."""
    w = w.float()
    scale = (w.abs().amax(dim=1) / 127.0).clamp(min=1e-12)
    q = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8)
    return q, scale


def quantize_int4(w: torch.Tensor, group_size: int = INT4_GROUP_SIZE) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Asymmetric int4 in groups along the input dim: w ~= q * scale + lo, q in 0..15.

    Returns (q [N, K] int32, scale [N, K/g], lo [N, K/g]) in float32.
    """
    n, k = w.shape
    if k % group_size:
        raise ValueError(f"int4 needs the input dim ({k}) to be a multiple of {group_size}")
    g = w.float().reshape(n, k // group_size, group_size)
    lo = g.amin(dim=2)
    hi = g.amax(dim=2)
    scale = ((hi - lo) / 15.0).clamp(min=1e-12)
    q = torch.round((g - lo[..., None]) / scale[..., None]).clamp(0, 15).to(torch.int32)
    return q.reshape(n, k), scale, lo


class WeightOnlyLinear(nn.Module):
    """A drop-in for nn.Linear holding a packed int8/int4 weight and its dense dequantization."""

    def __init__(self, linear: nn.Linear, method: str, dtype: torch.dtype,
                 max_rows: int = DEFAULT_MAX_ROWS) -> None:  # fmt: skip
        super().__init__()
        if method not in ("int8", "int4"):
            raise ValueError(f"quantization method must be int8 or int4, got {method!r}")
        self.method = method
        self.max_rows = max_rows
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        w = linear.weight.detach()
        if method == "int8":
            q, scale = quantize_int8(w)
            scale = scale.to(dtype)  # the kernel takes scales in the activation dtype
            self.register_buffer("qweight", q)
            self.register_buffer("scales", scale)
            dense = q.float() * scale.float()[:, None]
        else:
            q, scale, lo = quantize_int4(w)
            g = INT4_GROUP_SIZE
            # the kernel computes (q - 8) * scale + zero, scale/zero in the activation dtype
            scale_t = scale.to(dtype)
            zero_t = (lo + 8 * scale).to(dtype)
            packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 2)
            self.register_buffer("qweight", packed)
            self.register_buffer("scales", torch.stack([scale_t.T, zero_t.T], dim=-1).contiguous())
            n = q.shape[0]
            dense = ((q.float() - 8).reshape(n, -1, g) * scale_t.float()[..., None]
                     + zero_t.float()[..., None]).reshape(n, -1)  # fmt: skip
        self.weight = nn.Parameter(dense.to(dtype), requires_grad=False)
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach().to(dtype), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // self.in_features
        if rows > self.max_rows or rows == 0:
            return F.linear(x, self.weight, self.bias)
        x2 = x.reshape(rows, self.in_features)
        if self.method == "int8":
            y = torch.ops.aten._weight_int8pack_mm(x2, self.qweight, self.scales)
        else:
            y = torch.ops.aten._weight_int4pack_mm_for_cpu(x2, self.qweight, INT4_GROUP_SIZE, self.scales)
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"{self.in_features}, {self.out_features}, {self.method}, max_rows={self.max_rows}"


def check_quantization(method: str, device: torch.device, dtype: torch.dtype) -> None:
    """Refuse combinations with no kernel (a clear error at load, not at the first step)."""
    if method not in QUANT_METHODS:
        raise ValueError(f"quantization must be one of {QUANT_METHODS}, got {method!r}")
    if method == "none":
        return
    if device.type != "cpu":
        raise ValueError(f"quantization {method!r} runs on the CPU only (device is {device.type}; "
                         "pass --device cpu)")
    if dtype == torch.float16:
        raise ValueError(f"quantization {method!r} needs dtype bfloat16 or float32, not float16")


def packed_max_rows(dtype: torch.dtype) -> int:
    """Rows up to which the packed kernels run: they pay off with bfloat16 activations only.

    With float32 activations torch's int8/int4 CPU kernels measured 5-15x slower than the
    dense float32 GEMM (docs/benchmarks.md), so a float32 model computes with the
    dequantized weights alone: the quantized model's numerics, none of its speed.
    """
    return DEFAULT_MAX_ROWS if dtype == torch.bfloat16 else 0


def quantize_model(model: nn.Module, method: str, dtype: torch.dtype,
                   max_rows: int = DEFAULT_MAX_ROWS) -> int:  # fmt: skip
    """Replace every nn.Linear of `model` in place; returns how many were replaced.

    With int4 the output projection (`lm_head`) gets int8: 4 bits on the vocab projection
    visibly change greedy text, and the formats int4 stands in for keep it wider too (the
    default model's GGUF is Q4_1 everywhere but the tied embedding/output, Q8_0).
    """
    if method == "none":
        return 0
    targets = [(name, mod) for name, mod in model.named_modules() if isinstance(mod, nn.Linear)]
    for name, mod in targets:
        parent_name, _, attr = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        m = "int8" if method == "int4" and attr == "lm_head" else method
        setattr(parent, attr, WeightOnlyLinear(mod, m, dtype, max_rows))
    return len(targets)
