"""Paged prefill attention in Triton: prompt chunks over a cached prefix (chunked prefill,
prefix-cache hits) and decode rows of a mixed step, varlen, one program per (sequence,
tile of queries, KV head). The tile loop, the GQA packing and the masks are
triton_attention.py's."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from scheduler_worker.backends.triton_attention import (
    PREFILL_TILE,
    _attend,
    _check_cache,
    _kernel_args,
    _tile,
)


# num_seqs changes from step to step: not specialized (== 1, % 16), so that no step
# compiles a variant of its own (see triton_attention.table_width)
@triton.jit(do_not_specialize=["num_seqs"])
def _prefill_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    tables_ptr,
    query_start_ptr,
    seq_lens_ptr,
    out_ptr,
    strides,
    qk_scale,
    window,
    head_dim,
    num_seqs,
    G: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    DOT_FP32: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    stride_qt, stride_qh, stride_ot, stride_oh, stride_tb, kv_strides = strides
    # program p of axis 0 is tile p - (query_start[s] // BLOCK_Q + s) of the last sequence s
    # whose first tile index query_start[s] // BLOCK_Q + s is <= p (a binary search): the
    # grid needs only the step's token and sequence counts, so a captured graph's padded
    # step has one (vLLM's unified attention does the same)
    pid = tl.program_id(0)
    kv_head = tl.program_id(1)
    lo_s: tl.int32 = 0
    hi_s: tl.int32 = num_seqs
    while lo_s < hi_s:
        mid = (lo_s + hi_s) // 2
        first = tl.load(query_start_ptr + mid).to(tl.int32) // BLOCK_Q + mid
        if first <= pid:
            lo_s = mid + 1
        else:
            hi_s = mid
    seq_i = lo_s - 1
    q_begin = tl.load(query_start_ptr + seq_i).to(tl.int32)
    q_tile = pid - (q_begin // BLOCK_Q + seq_i)
    seq = seq_i.to(tl.int64)
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
    kv = (k_cache_ptr, v_cache_ptr, tables_ptr + seq * stride_tb, kv_head, kv_strides, BLOCK_SIZE)
    m_i, l_i, acc = _attend(
        q,
        q_pos,
        key_lo,
        start,
        tile_last + 1,
        seq_len,
        kv,
        qk_scale,
        offs_d,
        mask_d,
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
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal attention of the query chunks of S sequences over their paged contexts.

    q [T, H, D]: sequence s owns rows query_start_loc[s] .. query_start_loc[s + 1] - 1
    (query_start_loc [S + 1] int32); block_tables [S, W]; seq_lens [S]: tokens in s's
    context after this step (cached prefix + chunk), so query row j of s (0-based within s)
    sits at position seq_lens[s] - q_len_s + j. The chunk's own K/V are already in the
    cache. Chunks over a cached prefix and decode rows (q_len 1) mix freely in one call.
    The grid is T / BLOCK_Q + S programs a KV head, whatever the chunks' lengths: a step
    padded to fixed T and S (trailing sequences of no tokens, rows past the last sequence)
    runs from a captured graph. Output [T, H, D] in q's dtype (into `out` when given); rows
    outside every sequence are left untouched.
    """
    _check_cache(q, k_cache, v_cache)
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    group = num_heads // num_kv_heads
    num_seqs = block_tables.shape[0]
    if out is None:
        out = torch.empty_like(q)
    if num_tokens == 0 or num_seqs == 0:
        return out
    block_d = triton.next_power_of_2(head_dim)
    tile = _tile(PREFILL_TILE, block_d)
    block_m = max(16, triton.next_power_of_2(group), tile["block_m"])
    block_q = block_m // group
    grid = (triton.cdiv(num_tokens, block_q) + num_seqs, num_kv_heads)
    _prefill_kernel[grid](
        q,
        k_cache,
        v_cache,
        block_tables,
        query_start_loc,
        seq_lens,
        out,
        head_dim=head_dim,
        num_seqs=num_seqs,
        G=group,
        BLOCK_Q=block_q,
        BLOCK_M=block_m,
        **_kernel_args(q, k_cache, v_cache, block_tables, out, scale, window, tile, block_d),
    )
    return out
