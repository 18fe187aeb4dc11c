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

Decode may split a row's context over up to `num_splits` programs (long contexts, small
batches): each row takes as many splits as its own context has key tiles, up to that cap,
computed in the kernel from context_lens (so a graph captured at one cap follows every
step's contexts; a split past a row's count exits at once); each split takes a contiguous
range of the row's key tiles and writes an unnormalized partial (max, sum, acc) to
float32 scratch; a second kernel merges a row's used partials by log-sum-exp (a row of
one split is written whole, no partial, no merge). Nothing here reads a device value on the
host, so both entry points can be captured in a CUDA graph.
"""

from __future__ import annotations

import os
from typing import Any

import torch
import triton
import triton.language as tl

LOG2E = 1.4426950408889634
# Tile sizes and launch parameters, keyed by "small" (head_dim <= 128) and "large" head
# dims; warps and stages are ignored by the interpreter. Chosen on an H100:
# docs/benchmarks.md, "Triton attention tiles".
DECODE_TILE = {"small": {"block_n": 128, "num_warps": 4}, "large": {"block_n": 32, "num_warps": 4}}
PREFILL_TILE = {
    "small": {"block_m": 64, "block_n": 64, "num_warps": 4, "num_stages": 2},
    "large": {"block_m": 64, "block_n": 32, "num_warps": 4, "num_stages": 3},
}
MERGE_NUM_WARPS = 4


def _tile(table: dict[str, dict[str, int]], block_d: int) -> dict[str, int]:
    return table["small" if block_d <= 128 else "large"]


@triton.jit
def _attend(
    q,
    q_pos,
    key_lo,
    start,
    end,
    seq_len,
    kv,
    qk_scale,
    offs_d,
    mask_d,
    BLOCK_N: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """Online softmax of the rows of `q` [BLOCK_M, BLOCK_D] over the keys start .. end - 1
    of a sequence, a tile of BLOCK_N at a time (keys >= seq_len masked). Row r attends key
    j iff key_lo[r] < j <= q_pos[r]. Returns each row's running max (base 2), sum and
    unnormalized output: m_i, l_i, acc.

    `kv` says where the sequence's keys and values of one KV head live, as one tuple that
    the decode and prefill kernels build alike: (k_cache_ptr, v_cache_ptr, the sequence's
    block table row, kv_head, the caches' strides as cache_strides() gives them,
    BLOCK_SIZE). Triton inlines this function, so the kernels' code is what it was when
    each wrote the loop itself."""
    k_cache_ptr, v_cache_ptr, table_ptr, kv_head, strides, BLOCK_SIZE = kv
    stride_kb, stride_kr, stride_kh, stride_vb, stride_vr, stride_vh = strides
    m_i = tl.full([q.shape[0]], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([q.shape[0]], dtype=tl.float32)
    acc = tl.zeros(q.shape, dtype=tl.float32)
    for start_n in range(start, end, BLOCK_N):
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
            mask_n[None, :]
            & (offs_n[None, :] <= q_pos[:, None])
            & (offs_n[None, :] > key_lo[:, None])
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
        acc = acc * alpha[:, None] + tl.dot(
            p.to(q.dtype), v.to(q.dtype), input_precision=DOT_PRECISION
        )
        m_i = m_new
    return m_i, l_i, acc


TABLE_ALIGN = 16  # Triton specializes an int argument on divisibility by 16 (and on == 1)


def table_width(blocks: int) -> int:
    """The width of a step's block tables for `blocks` blocks: a multiple of TABLE_ALIGN.
    The kernels take the tables' row stride as an int argument, and Triton compiles a
    variant per specialization of it; a width that is always a multiple of 16 keeps every
    step on the variant start-up compiled (else an eager step of a new width compiled one
    mid-serving: ~0.6 s of every stream stalled on an H100)."""
    return max(1, -(-blocks // TABLE_ALIGN)) * TABLE_ALIGN


def _check_cache(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> None:
    num_heads, head_dim = q.shape[1], q.shape[2]
    num_kv_heads = k_cache.shape[2]
    assert k_cache.shape[3] == head_dim and v_cache.shape == k_cache.shape
    assert k_cache.stride(-1) == 1 and v_cache.stride(-1) == 1 and q.stride(-1) == 1
    assert num_heads % num_kv_heads == 0, "GQA needs H divisible by Hkv"


def cache_strides(k_cache: torch.Tensor, v_cache: torch.Tensor) -> tuple[int, ...]:
    """The block, row and head strides of k_cache then v_cache [NB, BS, Hkv, D], as every
    kernel that reads or writes the paged cache takes them: one tuple argument (Triton
    specializes each element as it would six separate ints)."""
    return (*k_cache.stride()[:3], *v_cache.stride()[:3])


def _dot_fp32(q: torch.Tensor) -> bool:
    """Whether the tile products run in float32 (then IEEE, not TF32): for float32 queries,
    and under the interpreter, whose tl.dot multiplies bfloat16 operands as their raw
    uint16 bits. Otherwise K/V are cast to q's half type and the products accumulate in
    float32 on the tensor cores."""
    return q.dtype == torch.float32 or os.environ.get("TRITON_INTERPRET") == "1"


def _kernel_args(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    out: torch.Tensor,
    scale: float,
    window: int,
    tile: dict[str, int],
    block_d: int,
) -> dict[str, Any]:
    """The arguments the decode and prefill kernels take alike, by name: every stride as
    one tuple (q's and out's token and head strides, block_tables' row stride, then
    cache_strides()), the scale in base 2, the window, the key tile, the cache's block
    size, how the tile products run (_dot_fp32), and the tile's warps and, where it sets
    them, stages."""
    dot_fp32 = _dot_fp32(q)
    row_strides = (*q.stride()[:2], *out.stride()[:2], block_tables.stride(0))
    return {
        "strides": (*row_strides, cache_strides(k_cache, v_cache)),
        "qk_scale": scale * LOG2E,
        "window": window,
        "BLOCK_D": block_d,
        "BLOCK_N": tile["block_n"],
        "BLOCK_SIZE": k_cache.shape[1],
        "DOT_FP32": dot_fp32,
        "DOT_PRECISION": "ieee" if dot_fp32 else "tf32",
        **{name: value for name, value in tile.items() if name.startswith("num_")},
    }
