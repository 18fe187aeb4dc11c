"""A few-row GEMV for the GPU's decode linears: y [M, N] = x [M, K] @ W [N, K].T (+ bias),
M <= MAX_ROWS, bf16 / fp16 in, float32 accumulation, y in x's dtype.

At batch 1-8 a decode step's linears read every weight once and do almost no math, so the
kernel is a weight stream: one program per (BLOCK_N outputs, K slice). Where N alone gives
too few programs to keep every SM's loads in flight (o_proj, down_proj: N = hidden), K is
split over `num_splits(n, k)` programs, and the partials are combined in the same launch:

    program (tile n, split s)  ──▶ its float32 partial [M, BLOCK_N] to part[s]
                               ──▶ atomic count[n] += 1 (acq_rel, after a CTA barrier)
    the last to arrive (count == S - 1) ──▶ sums part[0] .. part[S - 1] in that order, adds
                               the bias, casts, stores y, and sets count[n] back to 0

Why a fixed split summed by the last program, not float32 atomics into y: the sum's order
is fixed, so a row's output does not depend on which program finished first (greedy and
seeded outputs repeat run to run); no zeroed accumulator is needed, only the counters, which
each launch leaves at zero (the invariant: every counter is 0 between launches). The split
depends on (N, K) and the SM count only, never on M, so within the GEMV a row's numbers do
not depend on how many rows share the step (the route itself is chosen per row count). Grid sizes come from host ints, the workspace is
preallocated (GemvWorkspace) and nothing is read back on the host, so a CUDA graph captures
it; launches sharing one workspace must run in order on one stream (the decode graphs do).

tl.dot wants 16 rows: x is loaded as BLOCK_M = 16 rows, those past M masked to zero, so
M is a runtime argument and one compiled variant serves M 2-8 (Triton specializes an int
argument of 1: M = 1 is a second; bias or none, bf16 or fp16 are others). Runs under
TRITON_INTERPRET=1 on CPU tensors (tests); on a GPU it is unrun so far (docs/benchmarks.md,
"A few-row GEMV for the GPU's decode").
"""

from __future__ import annotations

import os
from collections.abc import Iterable

import torch
import triton
import triton.language as tl

MAX_ROWS = 8  # the decode graphs' smallest buckets: 1, 2, 4, 8 rows
BLOCK_M, BLOCK_N, BLOCK_K = 16, 64, 128
MAX_SPLIT = 16
MIN_K_BLOCKS = 2  # each split reads at least this many BLOCK_K columns
PROGRAMS_PER_SM = 4  # the split's target: enough programs for every SM's loads in flight
NUM_WARPS, NUM_STAGES = 4, 3
DTYPES = (torch.bfloat16, torch.float16)


@triton.jit
def _gemv_kernel(
    x_ptr,
    w_ptr,
    b_ptr,
    y_ptr,
    part_ptr,
    count_ptr,
    M,
    N,
    K,
    k_per_split,
    stride_xm,
    stride_wn,
    stride_ym,
    HAS_BIAS: tl.constexpr,
    DOT_FP32: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    num_splits = tl.num_programs(1)
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    m_mask = offs_m < M
    n_mask = offs_n < N
    w_rows = w_ptr + offs_n.to(tl.int64)[:, None] * stride_wn
    x_rows = x_ptr + offs_m[:, None] * stride_xm
    k_start = pid_k * k_per_split
    k_end = tl.minimum(K, k_start + k_per_split)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(k_start, k_end, BLOCK_K):
        k = k0 + offs_k
        k_mask = k < k_end
        x = tl.load(x_rows + k[None, :], mask=m_mask[:, None] & k_mask[None, :], other=0.0)
        w = tl.load(w_rows + k[None, :], mask=n_mask[:, None] & k_mask[None, :], other=0.0)
        if DOT_FP32:  # the interpreter's tl.dot takes bf16 operands as their raw bits
            acc = tl.dot(x.to(tl.float32), tl.trans(w.to(tl.float32)), acc, input_precision="ieee")
        else:
            acc = tl.dot(x, tl.trans(w), acc)
    out_mask = m_mask[:, None] & n_mask[None, :]
    tile = offs_m[:, None] * N + offs_n[None, :]  # an [M, N] partial's offsets
    if num_splits == 1:
        _store_out(acc, b_ptr, y_ptr, offs_m, offs_n, n_mask, out_mask, stride_ym, HAS_BIAS)
    else:
        tl.store(part_ptr + pid_k * M * N + tile, acc, mask=out_mask)
        tl.debug_barrier()  # every thread's partial stored before the count says so
        arrived = tl.atomic_add(count_ptr + pid_n, 1, sem="acq_rel")
        if arrived == num_splits - 1:  # the last of this tile's splits: all partials are in
            total = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for s in range(0, num_splits):  # in split order: the same sum every run
                p = part_ptr + s * M * N + tile
                total += tl.load(p, mask=out_mask, other=0.0, cache_modifier=".cg")
            tl.atomic_xchg(count_ptr + pid_n, 0)  # the next launch finds it at zero
            _store_out(total, b_ptr, y_ptr, offs_m, offs_n, n_mask, out_mask, stride_ym, HAS_BIAS)


@triton.jit
def _store_out(acc, b_ptr, y_ptr, offs_m, offs_n, n_mask, out_mask, stride_ym, HAS_BIAS):
    if HAS_BIAS:
        acc += tl.load(b_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
    y = y_ptr + offs_m[:, None] * stride_ym + offs_n[None, :]
    tl.store(y, acc.to(y_ptr.dtype.element_ty), mask=out_mask)


def num_splits(n: int, k: int, num_sms: int) -> int:
    """K's split for an [N, K] weight: a power of two, up to MAX_SPLIT, growing while the
    N tiles alone give fewer than PROGRAMS_PER_SM programs per SM and each split keeps
    MIN_K_BLOCKS blocks of K. Independent of M (see the module's docstring)."""
    tiles, k_blocks = triton.cdiv(n, BLOCK_N), triton.cdiv(k, BLOCK_K)
    split = 1
    while (
        split < MAX_SPLIT
        and tiles * split < PROGRAMS_PER_SM * num_sms
        and k_blocks >= 2 * split * MIN_K_BLOCKS
    ):
        split *= 2
    return split


class GemvWorkspace:
    """The split launches' float32 partials and per-tile arrival counters, on one device,
    sized for a set of [N, K] shapes at up to MAX_ROWS rows. Made before any graph is
    captured; shared by launches that run in order on one stream. Counters start at zero
    and every launch leaves them there."""

    def __init__(
        self,
        device: torch.device,
        num_sms: int,
        shapes: Iterable[tuple[int, int]],
        max_split: int | None = None,
    ) -> None:
        """`max_split`: room for any split up to it at every shape (benchmarks' sweeps)."""
        self.device, self.num_sms = device, num_sms
        part, tiles = 1, 1
        for n, k in shapes:
            split = max_split or num_splits(n, k, num_sms)
            if split > 1:
                part = max(part, split * MAX_ROWS * n)
                tiles = max(tiles, triton.cdiv(n, BLOCK_N))
        self.partials = torch.empty(part, dtype=torch.float32, device=device)
        self.counters = torch.zeros(tiles, dtype=torch.int32, device=device)


def supports(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether gemv() takes these operands: 2-D x of at most MAX_ROWS rows, both in one
    half-precision dtype, unit stride along K."""
    return (
        x.dim() == 2
        and 0 < x.shape[0] <= MAX_ROWS
        and x.dtype in DTYPES
        and weight.dtype == x.dtype
        and weight.dim() == 2
        and x.shape[1] == weight.shape[1]
        and x.stride(1) == 1
        and weight.stride(1) == 1
    )


def gemv(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    workspace: GemvWorkspace,
    split: int | None = None,
) -> torch.Tensor:
    """F.linear(x, weight, bias) for supports(x, weight) operands, in one launch; `split`
    overrides num_splits() (tests)."""
    assert supports(x, weight), "gemv: 2-D half-precision x of <= 8 rows, K-contiguous"
    m, k = x.shape
    n = weight.shape[0]
    if split is None:
        split = num_splits(n, k, workspace.num_sms)
    # each split a whole number of BLOCK_K blocks; no split left empty
    k_per_split = triton.cdiv(triton.cdiv(k, split), BLOCK_K) * BLOCK_K
    split = triton.cdiv(k, k_per_split)
    tiles = triton.cdiv(n, BLOCK_N)
    if split > 1:
        assert split * m * n <= workspace.partials.numel() and tiles <= workspace.counters.numel()
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    _gemv_kernel[(tiles, split)](
        x, weight, weight if bias is None else bias, y, workspace.partials, workspace.counters,
        m, n, k, k_per_split, x.stride(0), weight.stride(0), y.stride(0),
        HAS_BIAS=bias is not None, DOT_FP32=os.environ.get("TRITON_INTERPRET") == "1",
        BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K,
        num_warps=NUM_WARPS, num_stages=NUM_STAGES,
    )  # fmt: skip
    return y
