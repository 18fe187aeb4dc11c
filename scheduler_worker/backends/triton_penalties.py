"""A step's penalties on a GPU in one Triton launch: the CPU's C++ op
(kernels/csrc/penalize_rows.cpp) as a kernel, the same contract and the same numbers (each
a float32 operation rounded as torch's: the division correctly rounded, no FMA), where the
torch path issues ~12 ops a step over the penalized rows (penalties.py).

    penalize_rows(logits [R, V'] f32, rows [k] i64, entries [k] i64, counts [E, V] f32,
                  seen [E, V] bool, pending [k] i64, prev_tokens [P] i64, nums [k, 3] f32,
                  flags) -> None, the penalized rows of `logits` written in place (and,
                  with flags & 8, each token in flight added to its entry of `counts`)

One program a (row, tile of the vocabulary). Under TRITON_INTERPRET=1 it runs on CPU
tensors, which is how the tests check it (tests/scheduler_worker/test_penalty_counts.py).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

TILE = 1024  # tokens a program


@triton.jit(do_not_specialize=["flags"])  # one compile for every mix of terms
def _penalize_rows_kernel(
    logits,
    stride_l,
    rows,
    entries,
    counts,
    seen,
    pending,
    prev,
    nums,
    V,
    flags,
    TILE: tl.constexpr,
):
    i = tl.program_id(0)
    offs = tl.program_id(1) * TILE + tl.arange(0, TILE)
    inside = offs < V
    row = tl.load(rows + i)
    entry = tl.load(entries + i)
    at = tl.load(pending + i)
    tok = tl.load(prev + tl.maximum(at, 0))  # prev holds one element at least
    tok = tl.where(at >= 0, tok, -1)
    c = tl.load(counts + entry * V + offs, mask=inside, other=0.0)
    c = tl.where(offs == tok, c + 1.0, c)
    if flags & 8:  # commit: the token in flight stays counted (its tile's program alone)
        tl.store(counts + entry * V + offs, c, mask=inside & (offs == tok))
    x_at = logits + row * stride_l + offs
    x = tl.load(x_at, mask=inside, other=0.0)
    if flags & 1:
        rep = tl.load(nums + i * 3)
        s = tl.load(seen + entry * V + offs, mask=inside, other=0) != 0
        # a row at 1.0 too: x / 1 and x * 1 are x, bit for bit
        x = tl.where(s | (c > 0.0), tl.where(x > 0.0, tl.math.div_rn(x, rep), x * rep), x)
    if flags & 2:
        pres = tl.load(nums + i * 3 + 1)
        x = x - pres * tl.where(c > 0.0, 1.0, 0.0)
    if flags & 4:
        freq = tl.load(nums + i * 3 + 2)
        x = x - freq * c
    tl.store(x_at, x, mask=inside)


def penalize_rows(
    logits: torch.Tensor,
    rows: torch.Tensor,
    entries: torch.Tensor,
    counts: torch.Tensor,
    seen: torch.Tensor,
    pending: torch.Tensor,
    prev_tokens: torch.Tensor,
    nums: torch.Tensor,
    flags: int,
) -> None:
    """The GPU backend's penalty op (module doc): the arguments' shapes checked on the host
    (no device read), one launch."""
    if logits.dim() != 2 or logits.dtype != torch.float32 or logits.stride(1) != 1:
        raise ValueError("penalize_rows: logits must be float32 [R, V], rows contiguous")
    if counts.dim() != 2 or counts.dtype != torch.float32 or not counts.is_contiguous():
        raise ValueError("penalize_rows: counts must be a contiguous float32 [E, V]")
    if seen.shape != counts.shape or seen.dtype != torch.bool or not seen.is_contiguous():
        raise ValueError("penalize_rows: seen must be a contiguous bool [E, V]")
    vocab, k = counts.shape[1], rows.shape[0]
    if vocab > logits.shape[1]:
        raise ValueError("penalize_rows: counts wider than the logits")
    for t in (rows, entries, pending):
        if t.shape != (k,) or t.dtype != torch.long or not t.is_contiguous():
            raise ValueError(
                "penalize_rows: rows, entries and pending must be contiguous int64 [k]"
            )
    if nums.shape != (k, 3) or nums.dtype != torch.float32 or not nums.is_contiguous():
        raise ValueError("penalize_rows: nums must be a contiguous float32 [k, 3]")
    if k == 0:
        return
    prev = prev_tokens if prev_tokens.numel() else rows.new_zeros(1)
    _penalize_rows_kernel[(k, triton.cdiv(vocab, TILE))](
        logits,
        logits.stride(0),
        rows,
        entries,
        counts,
        seen.view(torch.uint8),
        pending,
        prev.contiguous(),
        nums,
        vocab,
        flags,
        TILE=TILE,
        enable_fp_fusion=False,  # x - freq * c rounded twice, as torch's two ops
    )


def warm_up(device: torch.device, vocab: int) -> None:
    """Compile the kernel at start for this vocabulary: else a batch's first penalized row
    stalls every stream for the compile."""
    logits = torch.zeros(1, vocab, device=device)
    counts = torch.zeros(1, vocab, device=device)
    seen = torch.zeros(1, vocab, dtype=torch.bool, device=device)
    zero = torch.zeros(1, dtype=torch.long, device=device)
    nums = torch.tensor([[1.2, 0.5, 0.5]], device=device)
    penalize_rows(logits, zero, zero, counts, seen, zero - 1, zero, nums, 7)
