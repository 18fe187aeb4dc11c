"""Paged attention in pure torch (CPU and CUDA).

The KV cache of one layer is a pair of tensors [num_blocks, block_size, num_kv_heads,
head_dim]. A sequence owns a block table (list of block ids); token i of the sequence
lives in block `table[i // block_size]`, row `i % block_size`, i.e. at the flat slot
`table[i // block_size] * block_size + i % block_size`.

One forward step runs over a flat token dimension T holding, in this order:

    [ decode tokens (1 per sequence) | prefill chunk of seq a | prefill chunk of seq b | ... ]

New K/V are written to the cache at `slot_mapping` (one slot per token) before attention
reads it, so a prefill chunk sees its own tokens as well as everything computed before
(prefix-cache hits, earlier chunks). Decode sequences are attended in one batched call
over a padded gather of their blocks; each prefill sequence gets its own SDPA call. Where
the C++ kernel serves the decodes ("paged"), every prefill chunk is attended by the same
kernel instead (PAGED_PREFILL_MAX_CONTEXT): each of its tokens is a row of its own, one
query over its sequence's blocks up to its own position, in one call with the step's
decodes (`AttentionMetadata.row_block_tables`).

Sliding-window layers (`window` W, as Mistral's and Gemma 3's local layers): the query at
position p attends keys p - W < j <= p, as transformers' sliding-window mask. The masks are
built here from the metadata, once per step and window (`AttentionMetadata.window_masks`).
The C++ decode kernel takes the window itself (it reads only the last W keys); the torch
decode paths use a window mask once a decode context passes W. Blocks wholly before every
layer's window may have been given back by the scheduler (their table entries then name a
placeholder block); neither the kernel nor the masks read them.

This backend is the reference: a faster one must produce the same outputs from the same
`AttentionMetadata`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from common.cpu import cpu_flags as common_cpu_flags
from common.env import env

# Prefill chunks of at most this many tokens of context (cached prefix + chunk; None: every
# chunk) are attended by the C++ paged kernel, token by token, rather than by torch's SDPA
# (one call per sequence and layer, over K/V gathered and cast from the cache's float16).
# The kernel's runs of consecutive queries read each block once for the run; served in
# 512-token chunks it took 0.61-0.75x SDPA's prefill time at 512-8000 tokens (AVX-512).
# And each query's arithmetic is a decode row's whatever its chunk, where SDPA's rounding
# moves with the chunk's shape: a prompt's logits are then the same computed fresh, in
# chunks of any size or over a cached prefix (docs/benchmarks.md, "One kernel for every
# prompt", where 384 was the limit before).
PAGED_PREFILL_MAX_CONTEXT: int | None = None


@dataclass
class PrefillSlice:
    start: int  # offset of this sequence's first query token in the flat token dim
    end: int
    num_context: int  # tokens attended: already computed + this chunk
    # block ids covering the context; None when the chunk is the whole context
    # (no earlier tokens), so attention runs on the fresh K/V without a gather
    block_ids: torch.Tensor | None = None
    mask: torch.Tensor | None = None  # [q_len, num_context] bool, True = attend
    paged: bool = False  # attended as rows of the C++ kernel (AttentionMetadata.row_*)


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor  # [T] int64: cache slot of every new token
    num_decode: int = 0  # decode tokens occupy [0, num_decode)
    decode_block_tables: torch.Tensor | None = None  # [num_decode, max_blocks] int64
    decode_mask: torch.Tensor | None = None  # [num_decode, 1, 1, max_blocks*block_size] bool
    decode_context_lens: torch.Tensor | None = None  # [num_decode] int64: tokens each attends
    prefills: list[PrefillSlice] = field(default_factory=list)
    logits_indices: torch.Tensor | None = None  # [num_seqs]: last token of each sequence
    decode_kernel: str = "sdpa"  # "sdpa" | "matmul" | "paged": see choose_decode_kernel()
    kernel_isa: int = 0  # the C++ kernels' path (index into kernels.ISAS) for "paged"
    decode_max_context: int = 0  # the longest decode context this step (0: not known)
    # With the "paged" kernel and short prefills: the rows the kernel attends in one call
    # (the decodes and every `paged` prefill's tokens), each its sequence's block table
    # padded to the widest and its context, position + 1; row_index: their places in the
    # step's tokens, None when they are all of them
    row_block_tables: torch.Tensor | None = None  # [R, max_blocks] int64
    row_context_lens: torch.Tensor | None = None  # [R] int64
    row_index: torch.Tensor | None = None  # [R] int64
    # (prefill index or -1 for the decodes, window) -> bool mask, built on first use
    window_masks: dict[tuple[int, int], torch.Tensor] = field(default_factory=dict)
    # The GPU's kernels (backends/triton_decode.py, triton_prefill.py): a decode-only step
    # splits each row's context over up to num_splits programs (as many as its key tiles);
    # any other step is described per sequence, in the step's order: its query rows
    # [query_start_loc[s], query_start_loc[s + 1]), its context after the step (seq_lens),
    # its blocks (block_tables, [S, width])
    num_splits: int = 1
    query_start_loc: torch.Tensor | None = None  # [S + 1] int32
    seq_lens: torch.Tensor | None = None  # [S] int32
    block_tables: torch.Tensor | None = None  # [S, width] int32
    max_query_len: int = 0

    def decode_window_mask(self, window: int, block_size: int) -> torch.Tensor:
        """[num_decode, 1, 1, width * block_size]: key j < ctx and j >= ctx - window."""
        key = (-1, window)
        mask = self.window_masks.get(key)
        if mask is None:
            assert self.decode_block_tables is not None and self.decode_context_lens is not None
            nd = self.num_decode
            ctx = self.decode_context_lens[:nd, None]
            cols = torch.arange(self.decode_block_tables.shape[1] * block_size, device=ctx.device)[
                None, :
            ]
            mask = ((cols < ctx) & (cols >= ctx - window)).view(nd, 1, 1, -1)
            self.window_masks[key] = mask
        return mask

    def prefill_window_mask(self, index: int, window: int) -> torch.Tensor:
        """[q_len, num_context] for prefill slice `index`: causal and within the window."""
        key = (index, window)
        mask = self.window_masks.get(key)
        if mask is None:
            p = self.prefills[index]
            dev = self.slot_mapping.device
            q_pos = torch.arange(p.num_context - (p.end - p.start), p.num_context, device=dev)
            k_pos = torch.arange(p.num_context, device=dev)[None, :]
            mask = (k_pos <= q_pos[:, None]) & (k_pos > q_pos[:, None] - window)
            self.window_masks[key] = mask
        return mask


def write_kv(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    num_kv_heads, head_dim = k_cache.shape[-2:]
    k_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, k.to(k_cache.dtype))
    v_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, v.to(v_cache.dtype))


def paged_attention(
    q: torch.Tensor,  # [T, num_heads, head_dim]
    k: torch.Tensor,  # [T, num_kv_heads, head_dim]
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
    kv_written: bool = False,  # the caller wrote k, v into the cache already (rope_write_kv)
    window: int | None = None,  # sliding window of this layer (None: global)
) -> torch.Tensor:  # [T, num_heads, head_dim]
    if not kv_written:
        write_kv(k_cache, v_cache, k, v, meta.slot_mapping)
    num_heads, head_dim = q.shape[1:]
    num_kv_heads = k.shape[1]
    out = torch.empty_like(q)
    nd = meta.num_decode
    if meta.row_block_tables is not None:  # the decodes and the short prefills
        assert meta.row_context_lens is not None
        rows = torch.ops.zeroserve.paged_decode_attention(
            q if meta.row_index is None else q.index_select(0, meta.row_index),
            k_cache,
            v_cache,
            meta.row_block_tables,
            meta.row_context_lens,
            scale,
            meta.kernel_isa,
            window or 0,
        )
        if meta.row_index is None:
            return rows
        out.index_copy_(0, meta.row_index, rows)
    elif nd and meta.decode_kernel == "paged":
        assert meta.decode_block_tables is not None and meta.decode_context_lens is not None
        dec = torch.ops.zeroserve.paged_decode_attention(
            q[:nd],
            k_cache,
            v_cache,
            meta.decode_block_tables,
            meta.decode_context_lens,
            scale,
            meta.kernel_isa,
            window or 0,
        )
        if nd == q.shape[0]:
            return dec  # a decode-only step
        out[:nd] = dec
    elif nd:
        assert meta.decode_block_tables is not None
        if window is not None and not 0 < meta.decode_max_context <= window:
            mask = meta.decode_window_mask(window, k_cache.shape[1])
        else:
            assert meta.decode_mask is not None
            mask = meta.decode_mask
        out[:nd] = _decode_attention(
            q[:nd],
            k_cache,
            v_cache,
            meta.decode_block_tables,
            mask,
            scale,
            meta.decode_kernel,
        )
    for i, p in enumerate(meta.prefills):
        if p.paged:
            continue
        qs = q[p.start : p.end].transpose(0, 1).unsqueeze(0)  # [1, H, q_len, D]
        windowed = window is not None and p.num_context > window
        if p.block_ids is None:
            ks, vs = k[p.start : p.end], v[p.start : p.end]
            if k_cache.dtype != q.dtype:  # as the cache holds them (float16 under float32):
                # a prompt then computes the same whether its prefix came from the cache
                ks, vs = ks.to(k_cache.dtype).to(q.dtype), vs.to(v_cache.dtype).to(q.dtype)
            causal = not windowed
        else:
            # the cached context in the model's dtype (a float16 cache under float32)
            ks = (
                k_cache.index_select(0, p.block_ids)
                .view(-1, num_kv_heads, head_dim)[: p.num_context]
                .to(q.dtype)
            )
            vs = (
                v_cache.index_select(0, p.block_ids)
                .view(-1, num_kv_heads, head_dim)[: p.num_context]
                .to(q.dtype)
            )
            causal = False
        o = F.scaled_dot_product_attention(
            qs,
            ks.transpose(0, 1).unsqueeze(0),
            vs.transpose(0, 1).unsqueeze(0),
            attn_mask=(
                None
                if causal
                else meta.prefill_window_mask(i, window)
                if windowed and window is not None
                else p.mask
            ),
            is_causal=causal,
            scale=scale,
            enable_gqa=num_heads != num_kv_heads,
        )
        out[p.start : p.end] = o.squeeze(0).transpose(0, 1)
    return out


DECODE_KERNELS = ("sdpa", "matmul", "paged")


def choose_decode_kernel(
    dtype: torch.dtype, cpu_flags: str | None = None, paged: bool = False
) -> str:
    """The CPU's decode attention (CpuBackend; a GPU's is its op set's). "paged" (the C++ kernel reading the KV blocks in place, scheduler_worker/kernels)
    on the CPU in float32 or bfloat16 whenever the kernels are built (`paged`): it skips
    the gather, the padding mask and the casts, and measured faster than both torch paths
    on every batch and context. Otherwise: SDPA, except for half precision on a CPU
    without AMX, where the fused bf16 SDPA kernel is slower than matmul + softmax +
    matmul (docs/benchmarks.md, "Serving vs the engine it wraps, transformers and
    llama.cpp", "Decode attention kernel"). float32: SDPA everywhere. The
    environment variable ZEROSERVE_DECODE_ATTENTION=sdpa|matmul overrides the choice."""
    forced = env("DECODE_ATTENTION")
    if forced:
        if forced not in DECODE_KERNELS:
            raise ValueError(
                f"ZEROSERVE_DECODE_ATTENTION must be one of {DECODE_KERNELS}, got {forced!r}"
            )
        if forced == "paged" and not paged:
            raise ValueError(
                "ZEROSERVE_DECODE_ATTENTION=paged needs the C++ kernels on a "
                "float32/bfloat16 CPU model"
            )
        return forced
    if paged and dtype in (torch.float32, torch.bfloat16):
        return "paged"
    if dtype not in (torch.bfloat16, torch.float16):
        return "sdpa"
    if cpu_flags is None:
        cpu_flags = " ".join(common_cpu_flags())
    return "sdpa" if "amx_bf16" in cpu_flags else "matmul"


def _decode_attention(
    q: torch.Tensor,  # [B, H, D]
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,  # [B, max_blocks]
    mask: torch.Tensor,  # [B, 1, 1, L] bool
    scale: float,
    kernel: str = "sdpa",
) -> torch.Tensor:
    """One query per sequence against its gathered blocks, padded to the longest, in one
    call for the whole batch: SDPA, or (kernel "matmul") two batched matmuls with the
    query heads grouped by the KV head they share, softmax in float32."""
    b, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    # [B, max_blocks, block_size, Hkv, D] -> [B, Hkv, L, D]
    # index_select along dim 0 copies whole blocks ~3x faster than advanced indexing on CPU
    flat = block_tables.reshape(-1)
    ks = k_cache.index_select(0, flat).view(b, -1, num_kv_heads, head_dim).transpose(1, 2)
    vs = v_cache.index_select(0, flat).view(b, -1, num_kv_heads, head_dim).transpose(1, 2)
    if kernel == "matmul":
        # query head h reads KV head h // group (as transformers' repeat_kv lays them out)
        qg = q.view(b, num_kv_heads, num_heads // num_kv_heads, head_dim)
        scores = torch.matmul(qg, ks.transpose(-1, -2)).float().mul_(scale)  # [B, Hkv, G, L]
        scores.masked_fill_(~mask, float("-inf"))  # mask [B, 1, 1, L] broadcasts
        probs = scores.softmax(dim=-1).to(q.dtype)
        return torch.matmul(probs, vs).view(b, num_heads, head_dim)
    out = F.scaled_dot_product_attention(
        q.unsqueeze(2),
        ks,
        vs,
        attn_mask=mask,
        scale=scale,
        enable_gqa=num_heads != num_kv_heads,
    )
    return out.squeeze(2)
