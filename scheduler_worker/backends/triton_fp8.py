"""An FP8 linear's matmul on a GPU (TritonOps.fp8_matmul, for quant/fp8.py's Fp8Linear):
the activations quantized per token in one Triton launch (each row's amax, its float32
scale amax / 448, and the row as E4M3), then torch._scaled_mm. One program a row, two passes over it in BLOCK-wide chunks (the amax, then the scaled store); no device value
read on the host, so a CUDA graph captures it. Runs under TRITON_INTERPRET=1 on a CPU."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

FP8, FP8_MAX = torch.float8_e4m3fn, 448.0  # as quant/fp8.py
BLOCK = 1024
NUM_WARPS = 4


@triton.jit
def _quantize_tokens_kernel(
    x_ptr, q_ptr, s_ptr, stride_x, stride_q, K, MAX: tl.constexpr, BLOCK_K: tl.constexpr
):
    row = tl.program_id(0).to(tl.int64)
    amax = tl.zeros((BLOCK_K,), dtype=tl.float32)
    for start in range(0, K, BLOCK_K):
        offs = start + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + row * stride_x + offs, mask=offs < K, other=0.0).to(tl.float32)
        amax = tl.maximum(amax, tl.abs(x))
    scale = tl.maximum(tl.max(amax, axis=0), 1e-12) / MAX
    tl.store(s_ptr + row, scale)
    for start in range(0, K, BLOCK_K):
        offs = start + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + row * stride_x + offs, mask=offs < K, other=0.0).to(tl.float32)
        q = tl.clamp(x / scale, -MAX, MAX)
        tl.store(q_ptr + row * stride_q + offs, q.to(q_ptr.dtype.element_ty), mask=offs < K)


def quantize_tokens(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] (rows contiguous) -> (E4M3 [M, K], float32 scales [M, 1]): quant/fp8.py's
    quantize_rows in one launch."""
    m, k = x.shape
    if x.stride(1) != 1:
        x = x.contiguous()
    q = torch.empty((m, k), dtype=FP8, device=x.device)
    s = torch.empty((m, 1), dtype=torch.float32, device=x.device)
    if m:
        _quantize_tokens_kernel[(m,)](
            x, q, s, x.stride(0), q.stride(0), k, MAX=FP8_MAX,
            BLOCK_K=min(BLOCK, triton.next_power_of_2(k)), num_warps=NUM_WARPS,
        )  # fmt: skip
    return q, s


def scaled_mm(
    x: torch.Tensor, qw: torch.Tensor, sw: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """Per-token FP8 activations (one Triton kernel) times the E4M3 weight on the tensor
    cores: torch._scaled_mm with row-wise scales, float32 [M, 1] and [1, N]; its row-wise
    path writes bfloat16 only, cast to x's dtype where that differs."""
    qx, sx = quantize_tokens(x)
    b = None if bias is None else bias.to(torch.bfloat16)
    y = torch._scaled_mm(qx, qw.t(), scale_a=sx, scale_b=sw.view(1, -1), bias=b,
                         out_dtype=torch.bfloat16)  # fmt: skip
    return y if x.dtype == torch.bfloat16 else y.to(x.dtype)
