"""The GPU backend's Triton kernels against plain-torch float32 references.

On a machine without CUDA the kernels run in Triton's interpreter (TRITON_INTERPRET=1,
set here before they are imported), on CPU tensors; with CUDA they run compiled, on the
GPU, unless the caller set TRITON_INTERPRET=1. Sizes are tiny: the interpreter is
slow. Paged caches use shuffled block tables, so a sequence's blocks are never contiguous.
"""

from __future__ import annotations

import math
import os
from typing import Any

import pytest
import torch

# Before the kernels are decorated (the interpreter is chosen then): without CUDA they run
# interpreted; with CUDA they run compiled unless the caller set TRITON_INTERPRET=1.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

from scheduler_worker.backends.triton_decode import paged_decode_attention  # noqa: E402
from scheduler_worker.backends.triton_ops import act_mul, rms_norm, rope_write_kv  # noqa: E402
from scheduler_worker.backends.triton_prefill import paged_prefill_attention  # noqa: E402

DEVICE = (
    "cuda" if torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1" else "cpu"
)


def _tol(dtype: torch.dtype) -> dict[str, Any]:
    return {"atol": 1e-4, "rtol": 1e-4} if dtype == torch.float32 else {"atol": 2e-2, "rtol": 2e-2}


# ---- elementwise ops ----------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_rms_norm_llama_with_residual(dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(5, 96, generator=gen).to(dtype).to(DEVICE)
    residual = torch.randn(5, 96, generator=gen).to(dtype).to(DEVICE)
    weight = (1 + 0.1 * torch.randn(96, generator=gen)).to(dtype).to(DEVICE)
    expect_res = residual.clone().add_(x)
    r = expect_res.float()
    y = r * torch.rsqrt(r.pow(2).mean(-1, keepdim=True) + 1e-6)
    expect = weight * y.to(dtype)
    out = rms_norm(x, residual, weight, 1e-6)
    # updated in place, rounded as residual.add_(x); the interpreter truncates float32 to
    # bfloat16 instead of rounding to nearest, so it may be one ulp off there
    exact = dtype != torch.bfloat16 or DEVICE == "cuda"
    ulp = 0.0 if exact else 2.0**-7
    torch.testing.assert_close(residual, expect_res, atol=0, rtol=ulp)
    torch.testing.assert_close(out, expect, **_tol(dtype))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_rms_norm_takes_a_half_precision_x_into_a_float32_residual(dtype: torch.dtype) -> None:
    """The GPU backend's residual stream is float32 under a bf16 / fp16 model: the add is
    exact in float32, the output has x's dtype, and it is the torch reference's."""
    from scheduler_worker.backends.ops import TorchOps

    gen = torch.Generator().manual_seed(3)
    x = (4 * torch.randn(5, 96, generator=gen)).to(dtype).to(DEVICE)
    residual = torch.randn(5, 96, generator=gen).to(DEVICE)
    weight = (1 + 0.1 * torch.randn(96, generator=gen)).to(dtype).to(DEVICE)
    expect_res = residual + x.float()
    reference_res = residual.clone()
    expect = TorchOps().rms_norm(x, reference_res, weight, 1e-6)
    out = rms_norm(x, residual, weight, 1e-6)
    assert residual.dtype == torch.float32 and out.dtype == dtype == expect.dtype
    torch.testing.assert_close(reference_res, expect_res, atol=0, rtol=0)
    torch.testing.assert_close(residual, expect_res, atol=0, rtol=0)
    torch.testing.assert_close(out, expect, **_tol(dtype))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_rms_norm_gemma_of_a_float32_stream_in_the_models_dtype(dtype: torch.dtype) -> None:
    """Gemma 3's sandwich norms read the float32 stream and give the model's dtype."""
    from scheduler_worker.backends.ops import TorchOps

    gen = torch.Generator().manual_seed(4)
    h = (3 * torch.randn(4, 80, generator=gen)).to(DEVICE)
    weight = (0.1 * torch.randn(80, generator=gen)).to(dtype).to(DEVICE)
    out = rms_norm(h, None, weight, 1e-6, weight_offset=1.0, out_dtype=dtype)
    expect = TorchOps().rms_norm(h, None, weight, 1e-6, 1.0, out_dtype=dtype)
    assert out.dtype == expect.dtype == dtype
    torch.testing.assert_close(out, expect, **_tol(dtype))


def test_rms_norm_of_heads_viewed_in_a_fused_row() -> None:
    """Gemma 3's q / k norms: [T, H, D] heads viewed in qkv's rows (not one stride)."""
    from scheduler_worker.backends.ops import TorchOps

    gen = torch.Generator().manual_seed(5)
    qkv = torch.randn(3, 5 * 32, generator=gen).to(DEVICE)
    heads = qkv[:, : 3 * 32].view(3, 3, 32)
    weight = (0.1 * torch.randn(32, generator=gen)).to(DEVICE)
    out = rms_norm(heads, None, weight, 1e-6, weight_offset=1.0)
    assert out.shape == heads.shape
    expect = TorchOps().rms_norm(heads, None, weight, 1e-6, 1.0)
    torch.testing.assert_close(out, expect, atol=1e-5, rtol=1e-5)


def test_rms_norm_gemma_no_residual() -> None:
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(3, 80, generator=gen).to(DEVICE)  # D not a power of two
    weight = (0.1 * torch.randn(80, generator=gen)).to(DEVICE)
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5)
    out = rms_norm(x, None, weight, 1e-5, weight_offset=1.0)
    torch.testing.assert_close(out, y * (1 + weight), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("act", ["silu", "gelu_tanh"])
def test_act_mul(act: str) -> None:
    gen = torch.Generator().manual_seed(2)
    gate_up = (3 * torch.randn(4, 2 * 40, generator=gen)).to(DEVICE)
    gate, up = gate_up.chunk(2, dim=-1)
    if act == "silu":
        expect = torch.nn.functional.silu(gate) * up
    else:
        expect = torch.nn.functional.gelu(gate, approximate="tanh") * up
    torch.testing.assert_close(act_mul(gate_up, act), expect, atol=1e-5, rtol=1e-5)
    half = act_mul(gate_up.half(), act)
    assert half.dtype == torch.float16
    torch.testing.assert_close(half.float(), expect, atol=2e-2, rtol=2e-2)


def _rope_tables(max_pos: int, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    inv_freq = 1.0 / (10000 ** (torch.arange(0, head_dim, 2).float() / head_dim))
    freqs = torch.outer(torch.arange(max_pos).float(), inv_freq)
    return freqs.cos().to(DEVICE), freqs.sin().to(DEVICE)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """HF rotate-half RoPE of x [T, heads, Dh] with cos / sin [T, Dh / 2]."""
    x1, x2 = x.float().chunk(2, dim=-1)
    c, s = cos[:, None, :], sin[:, None, :]
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1)


@pytest.mark.parametrize(
    ("q_dtype", "cache_dtype", "num_heads", "num_kv_heads", "head_dim"),
    [(torch.float32, torch.float16, 9, 3, 80), (torch.bfloat16, torch.bfloat16, 4, 1, 64)],
)
def test_rope_write_kv(
    q_dtype: torch.dtype,
    cache_dtype: torch.dtype,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
) -> None:
    gen = torch.Generator().manual_seed(3)
    num_tokens, block_size = 5, 16
    width = (num_heads + 2 * num_kv_heads) * head_dim
    qkv = torch.randn(num_tokens, width, generator=gen).to(q_dtype).to(DEVICE)
    positions = torch.tensor([0, 7, 33, 2, 60], device=DEVICE)
    slots = torch.tensor([3, -1, 40, 17, -1], device=DEVICE)  # two padding rows
    cos, sin = _rope_tables(64, head_dim)
    shape = (4, block_size, num_kv_heads, head_dim)
    k_cache = torch.randn(shape, generator=gen).to(cache_dtype).to(DEVICE)
    v_cache = torch.randn(shape, generator=gen).to(cache_dtype).to(DEVICE)
    k_before, v_before = k_cache.clone(), v_cache.clone()

    q, k = rope_write_kv(
        qkv, positions, cos, sin, k_cache, v_cache, slots.int(), num_heads, num_kv_heads
    )

    q_in, k_in, v_in = qkv.split(
        [num_heads * head_dim, num_kv_heads * head_dim, num_kv_heads * head_dim], dim=-1
    )
    c, s = cos[positions], sin[positions]
    expect_q = _rotate(q_in.reshape(num_tokens, num_heads, head_dim), c, s)
    expect_k = _rotate(k_in.reshape(num_tokens, num_kv_heads, head_dim), c, s)
    assert q.dtype == q_dtype and k.dtype == q_dtype
    torch.testing.assert_close(q.float(), expect_q, **_tol(q_dtype))
    torch.testing.assert_close(k.float(), expect_k, **_tol(q_dtype))
    flat_k = k_cache.view(-1, num_kv_heads, head_dim)
    flat_v = v_cache.view(-1, num_kv_heads, head_dim)
    written = slots >= 0
    v_rows = v_in.reshape(num_tokens, num_kv_heads, head_dim)
    torch.testing.assert_close(
        flat_k[slots[written]].float(), expect_k[written], atol=2e-2, rtol=2e-2
    )
    torch.testing.assert_close(flat_v[slots[written]], v_rows[written].to(cache_dtype))
    # every other slot (the padding rows' included) is unchanged
    untouched = torch.ones(flat_k.shape[0], dtype=torch.bool, device=DEVICE)
    untouched[slots[written]] = False
    assert torch.equal(flat_k[untouched], k_before.view_as(flat_k)[untouched])
    assert torch.equal(flat_v[untouched], v_before.view_as(flat_v)[untouched])


# ---- paged attention ----------------------------------------------------------------


def _paged_cache(
    seq_lens: list[int], num_kv_heads: int, head_dim: int, block_size: int, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random K/V caches and block tables [S, W] (int64) over shuffled blocks; table
    entries past a sequence's blocks name a real block that holds other data."""
    gen = torch.Generator().manual_seed(4)
    need = [max(1, math.ceil(n / block_size)) for n in seq_lens]
    num_blocks = sum(need) + 2
    perm = torch.randperm(num_blocks, generator=gen)
    width = max(need) + 1
    tables = torch.zeros(len(seq_lens), width, dtype=torch.int64)
    used = 0
    for s, n in enumerate(need):
        tables[s, :n] = perm[used : used + n]
        tables[s, n:] = perm[-1]  # a filler block, never to be read
        used += n
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = torch.randn(shape, generator=gen).to(dtype)
    v_cache = torch.randn(shape, generator=gen).to(dtype)
    return k_cache.to(DEVICE), v_cache.to(DEVICE), tables.to(DEVICE)


def _reference(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    table: torch.Tensor,
    seq_len: int,
    scale: float,
    window: int,
) -> torch.Tensor:
    """Float32 attention of q [n, H, D] (the last n positions of a context of seq_len
    tokens) over the context gathered from the cache by its block table."""
    n, num_heads, head_dim = q.shape
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    if seq_len == 0:
        return torch.zeros_like(q, dtype=torch.float32)
    idx = torch.arange(seq_len, device=q.device)
    blocks = table[idx // block_size]
    k = k_cache[blocks, idx % block_size].float()  # [L, Hkv, D]
    v = v_cache[blocks, idx % block_size].float()
    group = num_heads // num_kv_heads
    k = k.repeat_interleave(group, dim=1)  # query head h reads KV head h // group
    v = v.repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.float(), k) * scale
    q_pos = torch.arange(seq_len - n, seq_len, device=q.device)[:, None]
    keep = idx[None, :] <= q_pos
    if window > 0:
        keep &= idx[None, :] > q_pos - window
    scores = scores.masked_fill(~keep, float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v)


@pytest.mark.parametrize(
    ("num_heads", "num_kv_heads", "head_dim", "q_dtype", "cache_dtype", "block_size", "window"),
    [
        (4, 4, 64, torch.float32, torch.float16, 16, 0),  # 1:1, q wider than the cache
        (9, 3, 96, torch.float32, torch.float32, 32, 0),  # 3:1, head_dim 96
        (8, 2, 64, torch.bfloat16, torch.bfloat16, 16, 20),  # 4:1, sliding window
        (16, 1, 256, torch.float16, torch.float16, 16, 0),  # 16:1, head_dim 256
    ],
)
@pytest.mark.parametrize("num_splits", [1, 4])
def test_paged_decode(
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    q_dtype: torch.dtype,
    cache_dtype: torch.dtype,
    block_size: int,
    window: int,
    num_splits: int,
) -> None:
    context_lens = [1, 17, 100, 0]  # the last row is padding
    k_cache, v_cache, tables = _paged_cache(
        context_lens, num_kv_heads, head_dim, block_size, cache_dtype
    )
    gen = torch.Generator().manual_seed(5)
    q = torch.randn(len(context_lens), num_heads, head_dim, generator=gen).to(q_dtype)
    q = q.to(DEVICE)
    scale = head_dim**-0.5
    out = torch.full_like(q, float("nan"))  # written in full, padding row included
    got = paged_decode_attention(
        q,
        k_cache,
        v_cache,
        tables.int(),
        torch.tensor(context_lens, dtype=torch.int32, device=DEVICE),
        scale,
        window=window,
        out=out,
        num_splits=num_splits,
    )
    assert got is out and got.dtype == q_dtype
    for b, n in enumerate(context_lens):
        expect = _reference(q[b : b + 1], k_cache, v_cache, tables[b], n, scale, window)
        torch.testing.assert_close(got[b].float(), expect[0], **_tol(q_dtype))


def _run_prefill(
    q_lens: list[int],
    seq_lens: list[int],
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: torch.dtype,
    block_size: int,
    window: int,
    pad_seqs: int = 0,
    pad_rows: int = 0,
) -> None:
    """`pad_seqs` trailing sequences of no tokens and `pad_rows` rows past the last one:
    a step padded as a captured graph pads it (the padding rows stay untouched)."""
    k_cache, v_cache, tables = _paged_cache(seq_lens, num_kv_heads, head_dim, block_size, dtype)
    gen = torch.Generator().manual_seed(6)
    total = sum(q_lens)
    q = torch.randn(total + pad_rows, num_heads, head_dim, generator=gen).to(dtype).to(DEVICE)
    starts = [0]
    for n in q_lens:
        starts.append(starts[-1] + n)
    starts += [total] * pad_seqs
    lens_t = torch.tensor(seq_lens + [1] * pad_seqs, dtype=torch.int32, device=DEVICE)
    tables_t = torch.cat([tables, tables[:1].expand(pad_seqs, -1)]) if pad_seqs else tables
    scale = head_dim**-0.5
    out = torch.full_like(q, 7.0)
    got = paged_prefill_attention(
        q,
        k_cache,
        v_cache,
        tables_t,
        torch.tensor(starts, dtype=torch.int32, device=DEVICE),
        lens_t,
        scale,
        window=window,
        out=out,
    )
    assert got is out and got.dtype == dtype
    assert bool((got[total:] == 7.0).all())
    for s, seq_len in enumerate(seq_lens):
        rows = slice(starts[s], starts[s + 1])
        expect = _reference(q[rows], k_cache, v_cache, tables[s], seq_len, scale, window)
        torch.testing.assert_close(got[rows].float(), expect, **_tol(dtype))


def test_prefill_fresh_prompt() -> None:
    # one prompt from position 0, 4:1 GQA, several query tiles and key tiles
    _run_prefill([70], [70], 8, 2, 64, torch.float32, 16, 0)


def test_prefill_chunk_over_cached_prefix_windowed() -> None:
    # a 30-token chunk after a cached prefix of 37 tokens; window cut mid-block
    _run_prefill([30], [67], 9, 3, 96, torch.float32, 32, 0)
    _run_prefill([30], [67], 4, 4, 64, torch.float16, 16, 21)


def test_prefill_mixed_decodes_and_chunks() -> None:
    # decode rows (q_len 1), a fresh prompt and a chunk over a prefix, in one call
    _run_prefill([1, 1, 19, 12], [1, 40, 19, 49], 16, 1, 64, torch.bfloat16, 16, 0)


def test_prefill_padded_as_a_graph_pads_it() -> None:
    # the grid from T and S alone: three empty sequences and 21 rows past the last one
    _run_prefill([1, 17, 1], [33, 17, 5], 8, 2, 64, torch.float32, 16, 0, pad_seqs=3, pad_rows=21)
