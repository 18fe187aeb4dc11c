"""Paged decode attention in Triton: one query token per row, straight from the block
tables, its context split over `num_splits` programs for long contexts and small batches
(a second kernel merges the partials by log-sum-exp). The tile loop, the GQA packing and
the masks are triton_attention.py's."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from scheduler_worker.backends.triton_attention import (
    DECODE_TILE,
    MERGE_NUM_WARPS,
    _attend,
    _check_cache,
    _kernel_args,
    _tile,
)


@triton.jit
def _row_splits(seq_len, window, BLOCK_N: tl.constexpr, NUM_SPLITS: tl.constexpr):
    """How a row's context splits, from its own length (read on the device, so a captured
    graph follows each step's contexts): its first key tile, the tiles a split takes, and
    the splits that have any (at most NUM_SPLITS, one tile each at least; every split
    below `used` non-empty). The decode kernel and the merge both call it."""
    lo = tl.where(window > 0, seq_len - 1 - window, -1)
    first = (tl.maximum(lo + 1, 0) // BLOCK_N) * BLOCK_N
    num_tiles = tl.cdiv(tl.maximum(seq_len - first, 0), BLOCK_N)
    tiles_per_split = tl.maximum(tl.cdiv(num_tiles, NUM_SPLITS), 1)
    used = tl.maximum(tl.cdiv(num_tiles, tiles_per_split), 1)
    return first, tiles_per_split, used


@triton.jit
def _decode_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    tables_ptr,
    ctx_lens_ptr,
    out_ptr,
    part_m_ptr,
    part_l_ptr,
    part_acc_ptr,
    strides,
    qk_scale,
    window,
    num_heads,
    head_dim,
    NUM_SPLITS: tl.constexpr,
    G: tl.constexpr,
    BLOCK_G: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    DOT_FP32: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    stride_qb, stride_qh, stride_ob, stride_oh, stride_tb, kv_strides = strides
    row = tl.program_id(0).to(tl.int64)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(ctx_lens_ptr + row).to(tl.int32)
    first, tiles_per_split, used = _row_splits(seq_len, window, BLOCK_N, NUM_SPLITS)
    if split < used:  # a split past the row's count returns here, having read one int
        offs_g = tl.arange(0, BLOCK_G)
        offs_d = tl.arange(0, BLOCK_D)
        mask_g = offs_g < G
        mask_d = offs_d < head_dim
        heads = kv_head * G + offs_g
        q = tl.load(
            q_ptr + row * stride_qb + heads[:, None] * stride_qh + offs_d[None, :],
            mask=mask_g[:, None] & mask_d[None, :],
            other=0.0,
        )
        if DOT_FP32:
            q = q.to(tl.float32)
        pos = seq_len - 1
        q_pos = tl.zeros([BLOCK_G], dtype=tl.int32) + pos
        # attend keys lo < j <= pos
        key_lo = tl.zeros([BLOCK_G], dtype=tl.int32) + tl.where(window > 0, pos - window, -1)
        start = first + split * tiles_per_split * BLOCK_N
        end = tl.minimum(seq_len, start + tiles_per_split * BLOCK_N)
        kv = (
            k_cache_ptr,
            v_cache_ptr,
            tables_ptr + row * stride_tb,
            kv_head,
            kv_strides,
            BLOCK_SIZE,
        )
        m_i, l_i, acc = _attend(
            q, q_pos, key_lo, start, end, seq_len, kv, qk_scale, offs_d, mask_d, BLOCK_N,
            DOT_PRECISION,
        )  # fmt: skip
        if used == 1:  # the whole context in one program: no partials, no merge
            out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
            tl.store(
                out_ptr + row * stride_ob + heads[:, None] * stride_oh + offs_d[None, :],
                out.to(out_ptr.dtype.element_ty),
                mask=mask_g[:, None] & mask_d[None, :],
            )
        else:
            # partials [B, H, NUM_SPLITS] (+ [BLOCK_D] for acc), contiguous
            part = (row * num_heads + heads) * NUM_SPLITS + split
            tl.store(part_m_ptr + part, m_i, mask=mask_g)
            tl.store(part_l_ptr + part, l_i, mask=mask_g)
            tl.store(
                part_acc_ptr + part[:, None] * BLOCK_D + offs_d[None, :],
                acc,
                mask=mask_g[:, None],
            )


@triton.jit
def _merge_kernel(
    part_m_ptr,
    part_l_ptr,
    part_acc_ptr,
    ctx_lens_ptr,
    out_ptr,
    stride_ob,
    stride_oh,
    window,
    num_heads,
    head_dim,
    NUM_SPLITS: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """A row's partials merged by log-sum-exp: only its `used` splits are read; a row of
    one split was written whole by the decode kernel and is skipped."""
    row = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    seq_len = tl.load(ctx_lens_ptr + row).to(tl.int32)
    _, _, used = _row_splits(seq_len, window, BLOCK_N, NUM_SPLITS)
    if used > 1:
        offs_s = tl.arange(0, BLOCK_S)
        offs_d = tl.arange(0, BLOCK_D)
        mask_s = offs_s < used
        part = (row * num_heads + head) * NUM_SPLITS + offs_s
        m = tl.load(part_m_ptr + part, mask=mask_s, other=float("-inf"))
        l_s = tl.load(part_l_ptr + part, mask=mask_s, other=0.0)
        acc = tl.load(
            part_acc_ptr + part[:, None] * BLOCK_D + offs_d[None, :],
            mask=mask_s[:, None],
            other=0.0,
        )
        m_max = tl.max(m, axis=0)
        m_max = tl.where(m_max == float("-inf"), 0.0, m_max)  # no key in any split: zeros
        w = tl.where(mask_s, tl.exp2(m - m_max), 0.0)
        total = tl.sum(w * l_s, axis=0)
        out = tl.sum(w[:, None] * acc, axis=0) / tl.where(total == 0.0, 1.0, total)
        tl.store(
            out_ptr + row * stride_ob + head * stride_oh + offs_d,
            out.to(out_ptr.dtype.element_ty),
            mask=offs_d < head_dim,
        )


def num_decode_splits(
    batch: int, num_kv_heads: int, max_context_len: int, num_sms: int, head_dim: int = 64
) -> int:
    """A `num_splits` for paged_decode_attention (host ints only): enough programs for
    about two per SM, at most 16 splits and no more than the longest context has key
    tiles. On an H100 (132 SMs), Llama-1B shapes at 2000 keys: batch 1 -> 16, 8 -> 5,
    32 -> 2, 128 -> 1. A cap: each row then takes no more splits than its own context has
    key tiles (_row_splits)."""
    block_n = _tile(DECODE_TILE, triton.next_power_of_2(head_dim))["block_n"]
    wanted = triton.cdiv(2 * num_sms, max(1, batch * num_kv_heads))
    return max(1, min(16, wanted, triton.cdiv(max(1, max_context_len), block_n)))


def decode_workspace(
    batch: int, num_heads: int, num_splits: int, head_dim: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The split partials of paged_decode_attention, float32: each (row, head, split)'s
    running max (base 2) and sum [B, H, S], and its unnormalized output [B, H, S, BLOCK_D]."""
    block_d = triton.next_power_of_2(head_dim)
    part_m = torch.empty((batch, num_heads, num_splits), dtype=torch.float32, device=device)
    part_acc = torch.empty(
        (batch, num_heads, num_splits, block_d), dtype=torch.float32, device=device
    )
    return part_m, torch.empty_like(part_m), part_acc


def paged_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    window: int = 0,
    out: torch.Tensor | None = None,
    num_splits: int = 1,
    workspace: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """One query token per row over its paged context.

    q [B, H, D]; block_tables [B, W] (int32 / int64); context_lens [B]: row b attends keys
    0 .. context_lens[b] - 1 and its query sits at position context_lens[b] - 1 (its own
    K/V already in the cache). A row with context 0 (padding) gets zeros. `window` > 0
    restricts to the last `window` keys. The cache dtype may differ from q's; softmax is
    float32; the output [B, H, D] (written into `out` when given) has q's dtype.
    `num_splits` > 1: each row's context is split over up to that many programs, as many
    as its own context has key tiles (read on the device: a graph captured at one count
    serves any contexts), and the partials merged; `workspace` (decode_workspace()) holds
    the partials, else they are allocated here.
    """
    _check_cache(q, k_cache, v_cache)
    batch, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    group = num_heads // num_kv_heads
    if out is None:
        out = torch.empty_like(q)
    if batch == 0:
        return out
    block_d = triton.next_power_of_2(head_dim)
    tile = _tile(DECODE_TILE, block_d)
    if num_splits > 1:
        part_m, part_l, part_acc = workspace or decode_workspace(
            batch, num_heads, num_splits, head_dim, q.device
        )
        assert part_acc.shape == (batch, num_heads, num_splits, block_d)
    else:
        part_m = part_l = part_acc = out  # unused
    _decode_kernel[(batch, num_kv_heads, num_splits)](
        q,
        k_cache,
        v_cache,
        block_tables,
        context_lens,
        out,
        part_m,
        part_l,
        part_acc,
        num_heads=num_heads,
        head_dim=head_dim,
        NUM_SPLITS=num_splits,
        G=group,
        BLOCK_G=max(16, triton.next_power_of_2(group)),
        **_kernel_args(q, k_cache, v_cache, block_tables, out, scale, window, tile, block_d),
    )
    if num_splits > 1:
        _merge_kernel[(batch, num_heads)](
            part_m,
            part_l,
            part_acc,
            context_lens,
            out,
            out.stride(0),
            out.stride(1),
            window,
            num_heads,
            head_dim,
            NUM_SPLITS=num_splits,
            BLOCK_S=triton.next_power_of_2(num_splits),
            BLOCK_D=block_d,
            BLOCK_N=tile["block_n"],
            num_warps=MERGE_NUM_WARPS,
        )
    return out
