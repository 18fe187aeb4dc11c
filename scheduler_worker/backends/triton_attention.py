"""Paged attention in Triton, reading K/V straight from the paged cache.

Cache layout, per layer: k_cache, v_cache [num_blocks, block_size, num_kv_heads, head_dim];
token i of a sequence lives in block `block_table[i // block_size]`, row `i % block_size`.
A program gathers a tile of BLOCK_N keys through the block table (a table lookup per key,
so a tile may span several blocks, and blocks need not be contiguous) — no gathered copy.

GQA packing: query head h reads KV head h // G (G = H / Hkv). A program owns one KV head
and computes the G query heads that read it together, as the rows of one tile:

    tile row r  ->  query token r // G of the program's token tile, head kv_head * G + r % G

so each K/V tile is loaded once for G heads and tl.dot sees at least 16 rows even for a
decode (one token, G heads; rows past the valid ones are masked).

Masks: the query at position p attends keys j with j <= p (causal) and, with a sliding
`window` W > 0, p - W < j. Softmax runs online in float32 (base 2, the scale folded with
log2(e)); a row that has seen no key yet keeps max -inf and sum 0, and a row with no key
at all (context 0: a padding row) writes zeros, never NaN.

Decode may split a row's context over `num_splits` programs (long contexts, small batches):
each split takes a contiguous range of the row's key tiles, computed in the kernel from
context_lens, and writes an unnormalized partial (max, sum, acc) to float32 scratch; a
second kernel merges the partials by log-sum-exp. Nothing here reads a device value on the
host, so both entry points can be captured in a CUDA graph.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

LOG2E = 1.4426950408889634
# Tile sizes and launch parameters, keyed by "small" (head_dim <= 128) and "large" head
# dims; warps and stages are ignored by the interpreter. Measured on an H100 (bf16, block
# size 16, shuffled tables, CUDA-graph replay): decode of Llama-1B shapes (H 32, Hkv 8,
# D 64) at batch 128 x 2000 keys 192 us (SDPA on a contiguous copy: 175 us), batch 1 x
# 2000 keys with 16 splits 5.9 us; a 2048-token prefill 120 us (flash SDPA: 58 us).
DECODE_TILE = {"small": {"block_n": 128, "num_warps": 4}, "large": {"block_n": 32, "num_warps": 4}}
PREFILL_TILE = {
    "small": {"block_m": 64, "block_n": 64, "num_warps": 4, "num_stages": 2},
    "large": {"block_m": 64, "block_n": 32, "num_warps": 4, "num_stages": 3},
}
MERGE_NUM_WARPS = 4


def _tile(table: dict[str, dict[str, int]], block_d: int) -> dict[str, int]:
    return table["small" if block_d <= 128 else "large"]


@triton.jit
def _attend_tile(
    q,
    m_i,
    l_i,
    acc,
    q_pos,
    key_lo,
    start_n,
    seq_len,
    k_cache_ptr,
    v_cache_ptr,
    table_ptr,
    kv_head,
    stride_kb,
    stride_kr,
    stride_kh,
    stride_vb,
    stride_vr,
    stride_vh,
    qk_scale,
    offs_d,
    mask_d,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """One online-softmax step of the rows of `q` [BLOCK_M, BLOCK_D] over the keys
    start_n .. start_n + BLOCK_N - 1 of a sequence (keys >= seq_len masked). Row r attends
    key j iff key_lo[r] < j <= q_pos[r]. m_i / l_i / acc: running max (base 2), sum and
    unnormalized output of each row."""
    offs_n = start_n + tl.arange(0, BLOCK_N)
    mask_n = offs_n < seq_len
    block = tl.load(table_ptr + offs_n // BLOCK_SIZE, mask=mask_n, other=0).to(tl.int64)
    blk_row = (offs_n % BLOCK_SIZE).to(tl.int64)
    k_off = block * stride_kb + blk_row * stride_kr + kv_head * stride_kh
    k = tl.load(
        k_cache_ptr + k_off[None, :] + offs_d[:, None],
        mask=mask_n[None, :] & mask_d[:, None],
        other=0.0,
    )
    s = tl.dot(q, k.to(q.dtype), input_precision=DOT_PRECISION) * qk_scale
    keep = (
        mask_n[None, :] & (offs_n[None, :] <= q_pos[:, None]) & (offs_n[None, :] > key_lo[:, None])
    )
    s = tl.where(keep, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    # a row with no key so far keeps m = -inf: shift by 0 so exp2 gives 0, not NaN
    m_shift = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_shift)
    p = tl.exp2(s - m_shift[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    v_off = block * stride_vb + blk_row * stride_vr + kv_head * stride_vh
    v = tl.load(
        v_cache_ptr + v_off[:, None] + offs_d[None, :],
        mask=mask_n[:, None] & mask_d[None, :],
        other=0.0,
    )
    acc = acc * alpha[:, None] + tl.dot(p.to(q.dtype), v.to(q.dtype), input_precision=DOT_PRECISION)
    return m_new, l_i, acc


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
    stride_qb,
    stride_qh,
    stride_ob,
    stride_oh,
    stride_tb,
    stride_kb,
    stride_kr,
    stride_kh,
    stride_vb,
    stride_vr,
    stride_vh,
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
    row = tl.program_id(0).to(tl.int64)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
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
    seq_len = tl.load(ctx_lens_ptr + row).to(tl.int32)
    pos = seq_len - 1
    lo = tl.where(window > 0, pos - window, -1)  # attend keys lo < j <= pos
    q_pos = tl.zeros([BLOCK_G], dtype=tl.int32) + pos
    key_lo = tl.zeros([BLOCK_G], dtype=tl.int32) + lo
    # this split's contiguous range of key tiles
    first = (tl.maximum(lo + 1, 0) // BLOCK_N) * BLOCK_N
    num_tiles = tl.cdiv(tl.maximum(seq_len - first, 0), BLOCK_N)
    tiles_per_split = tl.cdiv(num_tiles, NUM_SPLITS)
    start = first + split * tiles_per_split * BLOCK_N
    end = tl.minimum(seq_len, start + tiles_per_split * BLOCK_N)
    m_i = tl.full([BLOCK_G], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_G], dtype=tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], dtype=tl.float32)
    for start_n in range(start, end, BLOCK_N):
        m_i, l_i, acc = _attend_tile(
            q,
            m_i,
            l_i,
            acc,
            q_pos,
            key_lo,
            start_n,
            seq_len,
            k_cache_ptr,
            v_cache_ptr,
            tables_ptr + row * stride_tb,
            kv_head,
            stride_kb,
            stride_kr,
            stride_kh,
            stride_vb,
            stride_vr,
            stride_vh,
            qk_scale,
            offs_d,
            mask_d,
            BLOCK_SIZE,
            BLOCK_N,
            DOT_PRECISION,
        )
    if NUM_SPLITS == 1:
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
    out_ptr,
    stride_ob,
    stride_oh,
    num_heads,
    head_dim,
    NUM_SPLITS: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    mask_s = offs_s < NUM_SPLITS
    part = (row * num_heads + head) * NUM_SPLITS + offs_s
    m = tl.load(part_m_ptr + part, mask=mask_s, other=float("-inf"))
    l_s = tl.load(part_l_ptr + part, mask=mask_s, other=0.0)
    acc = tl.load(
        part_acc_ptr + part[:, None] * BLOCK_D + offs_d[None, :], mask=mask_s[:, None], other=0.0
    )
    m_max = tl.max(m, axis=0)
    m_max = tl.where(m_max == float("-inf"), 0.0, m_max)  # no key in any split: zeros
    w = tl.exp2(m - m_max)
    total = tl.sum(w * l_s, axis=0)
    out = tl.sum(w[:, None] * acc, axis=0) / tl.where(total == 0.0, 1.0, total)
    tl.store(
        out_ptr + row * stride_ob + head * stride_oh + offs_d,
        out.to(out_ptr.dtype.element_ty),
        mask=offs_d < head_dim,
    )


def _check_cache(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> None:
    num_heads, head_dim = q.shape[1], q.shape[2]
    num_kv_heads = k_cache.shape[2]
    assert k_cache.shape[3] == head_dim and v_cache.shape == k_cache.shape
    assert k_cache.stride(-1) == 1 and v_cache.stride(-1) == 1 and q.stride(-1) == 1
    assert num_heads % num_kv_heads == 0, "GQA needs H divisible by Hkv"


def _dot_fp32(q: torch.Tensor) -> bool:
    """Whether the tile products run in float32 (then IEEE, not TF32): for float32 queries,
    and under the interpreter, whose tl.dot multiplies bfloat16 operands as their raw
    uint16 bits. Otherwise K/V are cast to q's half type and the products accumulate in
    float32 on the tensor cores."""
    return q.dtype == torch.float32 or os.environ.get("TRITON_INTERPRET") == "1"


def num_decode_splits(
    batch: int, num_kv_heads: int, max_context_len: int, num_sms: int, head_dim: int = 64
) -> int:
    """A `num_splits` for paged_decode_attention (host ints only): enough programs for
    about two per SM, at most 16 splits and no more than the longest context has key
    tiles. On an H100 (132 SMs), Llama-1B shapes at 2000 keys: batch 1 -> 16, 8 -> 5,
    32 -> 2, 128 -> 1."""
    block_n = _tile(DECODE_TILE, triton.next_power_of_2(head_dim))["block_n"]
    wanted = triton.cdiv(2 * num_sms, max(1, batch * num_kv_heads))
    return max(1, min(16, wanted, triton.cdiv(max(1, max_context_len), block_n)))


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
) -> torch.Tensor:
    """One query token per row over its paged context.

    q [B, H, D]; block_tables [B, W] (int32 / int64); context_lens [B]: row b attends keys
    0 .. context_lens[b] - 1 and its query sits at position context_lens[b] - 1 (its own
    K/V already in the cache). A row with context 0 (padding) gets zeros. `window` > 0
    restricts to the last `window` keys. The cache dtype may differ from q's; softmax is
    float32; the output [B, H, D] (written into `out` when given) has q's dtype.
    `num_splits` > 1 splits each row's context over that many programs and merges.
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
        part_m = torch.empty((batch, num_heads, num_splits), dtype=torch.float32, device=q.device)
        part_l = torch.empty_like(part_m)
        part_acc = torch.empty(
            (batch, num_heads, num_splits, block_d), dtype=torch.float32, device=q.device
        )
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
        q.stride(0),
        q.stride(1),
        out.stride(0),
        out.stride(1),
        block_tables.stride(0),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        v_cache.stride(0),
        v_cache.stride(1),
        v_cache.stride(2),
        scale * LOG2E,
        window,
        num_heads,
        head_dim,
        NUM_SPLITS=num_splits,
        G=group,
        BLOCK_G=max(16, triton.next_power_of_2(group)),
        BLOCK_D=block_d,
        BLOCK_N=tile["block_n"],
        BLOCK_SIZE=k_cache.shape[1],
        DOT_FP32=_dot_fp32(q),
        DOT_PRECISION="ieee" if _dot_fp32(q) else "tf32",
        num_warps=tile["num_warps"],
    )
    if num_splits > 1:
        _merge_kernel[(batch, num_heads)](
            part_m,
            part_l,
            part_acc,
            out,
            out.stride(0),
            out.stride(1),
            num_heads,
            head_dim,
            NUM_SPLITS=num_splits,
            BLOCK_S=triton.next_power_of_2(num_splits),
            BLOCK_D=block_d,
            num_warps=MERGE_NUM_WARPS,
        )
    return out


@triton.jit
def _prefill_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    tables_ptr,
    query_start_ptr,
    seq_lens_ptr,
    out_ptr,
    stride_qt,
    stride_qh,
    stride_ot,
    stride_oh,
    stride_tb,
    stride_kb,
    stride_kr,
    stride_kh,
    stride_vb,
    stride_vr,
    stride_vh,
    qk_scale,
    window,
    head_dim,
    G: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    DOT_FP32: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    seq = tl.program_id(0).to(tl.int64)
    q_tile = tl.program_id(1)
    kv_head = tl.program_id(2)
    q_begin = tl.load(query_start_ptr + seq).to(tl.int32)
    q_len = tl.load(query_start_ptr + seq + 1).to(tl.int32) - q_begin
    if q_tile * BLOCK_Q >= q_len:
        return
    seq_len = tl.load(seq_lens_ptr + seq).to(tl.int32)
    first_pos = seq_len - q_len  # position of the chunk's first query token
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < head_dim
    tok = q_tile * BLOCK_Q + offs_m // G  # query index within the sequence
    heads = kv_head * G + offs_m % G
    mask_m = (offs_m < BLOCK_Q * G) & (tok < q_len)
    q_rows = (q_begin + tok).to(tl.int64)
    q = tl.load(
        q_ptr + q_rows[:, None] * stride_qt + heads[:, None] * stride_qh + offs_d[None, :],
        mask=mask_m[:, None] & mask_d[None, :],
        other=0.0,
    )
    if DOT_FP32:
        q = q.to(tl.float32)
    q_pos = first_pos + tok
    key_lo = tl.where(window > 0, q_pos - window, -1)
    # keys this tile can see: from the first row's window start to the last row's position
    tile_first = first_pos + q_tile * BLOCK_Q
    tile_last = first_pos + tl.minimum(q_len, (q_tile + 1) * BLOCK_Q) - 1
    lo = tl.where(window > 0, tl.maximum(tile_first - window + 1, 0), 0)
    start = (lo // BLOCK_N) * BLOCK_N
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    for start_n in range(start, tile_last + 1, BLOCK_N):
        m_i, l_i, acc = _attend_tile(
            q,
            m_i,
            l_i,
            acc,
            q_pos,
            key_lo,
            start_n,
            seq_len,
            k_cache_ptr,
            v_cache_ptr,
            tables_ptr + seq * stride_tb,
            kv_head,
            stride_kb,
            stride_kr,
            stride_kh,
            stride_vb,
            stride_vr,
            stride_vh,
            qk_scale,
            offs_d,
            mask_d,
            BLOCK_SIZE,
            BLOCK_N,
            DOT_PRECISION,
        )
    out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
    tl.store(
        out_ptr + q_rows[:, None] * stride_ot + heads[:, None] * stride_oh + offs_d[None, :],
        out.to(out_ptr.dtype.element_ty),
        mask=mask_m[:, None] & mask_d[None, :],
    )


def paged_prefill_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    window: int = 0,
    *,
    max_query_len: int,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal attention of the query chunks of S sequences over their paged contexts.

    q [T, H, D]: sequence s owns rows query_start_loc[s] .. query_start_loc[s + 1] - 1
    (query_start_loc [S + 1] int32); block_tables [S, W]; seq_lens [S]: tokens in s's
    context after this step (cached prefix + chunk), so query row j of s (0-based within s)
    sits at position seq_lens[s] - q_len_s + j. The chunk's own K/V are already in the
    cache. Chunks over a cached prefix and decode rows (q_len 1) mix freely in one call.
    `max_query_len` (a host int, >= every q_len) sizes the grid. Output [T, H, D] in q's
    dtype (into `out` when given); rows outside every sequence are left untouched.
    """
    _check_cache(q, k_cache, v_cache)
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    group = num_heads // num_kv_heads
    num_seqs = block_tables.shape[0]
    if out is None:
        out = torch.empty_like(q)
    if num_tokens == 0 or num_seqs == 0 or max_query_len <= 0:
        return out
    block_d = triton.next_power_of_2(head_dim)
    tile = _tile(PREFILL_TILE, block_d)
    block_m = max(16, triton.next_power_of_2(group), tile["block_m"])
    block_q = block_m // group
    grid = (num_seqs, triton.cdiv(max_query_len, block_q), num_kv_heads)
    _prefill_kernel[grid](
        q,
        k_cache,
        v_cache,
        block_tables,
        query_start_loc,
        seq_lens,
        out,
        q.stride(0),
        q.stride(1),
        out.stride(0),
        out.stride(1),
        block_tables.stride(0),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        v_cache.stride(0),
        v_cache.stride(1),
        v_cache.stride(2),
        scale * LOG2E,
        window,
        head_dim,
        G=group,
        BLOCK_Q=block_q,
        BLOCK_M=block_m,
        BLOCK_D=block_d,
        BLOCK_N=tile["block_n"],
        BLOCK_SIZE=k_cache.shape[1],
        DOT_FP32=_dot_fp32(q),
        DOT_PRECISION="ieee" if _dot_fp32(q) else "tf32",
        num_warps=tile["num_warps"],
        num_stages=tile["num_stages"],
    )
    return out
