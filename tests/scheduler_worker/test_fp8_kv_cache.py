"""An FP8 (E4M3, scale 1) KV cache on the GPU backend's Triton kernels, on the CPU under
Triton's interpreter as test_triton_kernels.py runs them: the decode and prefill kernels
reading E4M3 K/V straight from the paged cache against float32 attention over the same
values widened, the RoPE + cache-write kernel saturating at +-448, and the backends'
choices (the CPU refuses it in one line; the CUDA backend gives E4M3, one byte an element:
its pool, sized by bytes, holds twice a bf16 cache's tokens)."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

from common.config import ConfigError  # noqa: E402
from scheduler_worker.backends.triton_decode import paged_decode_attention  # noqa: E402
from scheduler_worker.backends.triton_ops import rope_write_kv  # noqa: E402
from scheduler_worker.backends.triton_prefill import paged_prefill_attention  # noqa: E402
from scheduler_worker.quant.fp8 import FP8  # noqa: E402
from tests.scheduler_worker.test_triton_kernels import (  # noqa: E402
    DEVICE,
    _paged_cache,
    _reference,
)


@pytest.mark.parametrize("q_dtype", [torch.float32, torch.bfloat16])
def test_decode_and_prefill_read_an_fp8_cache(q_dtype):
    seq_lens, heads, kv_heads, dim, bs = [37, 5, 64], 8, 2, 64, 16
    k_cache, v_cache, tables = _paged_cache(seq_lens, kv_heads, dim, bs, FP8)
    assert k_cache.dtype == FP8 and k_cache.element_size() == 1
    gen = torch.Generator().manual_seed(7)
    q = torch.randn(len(seq_lens), heads, dim, generator=gen).to(q_dtype).to(DEVICE)
    lens = torch.tensor(seq_lens, dtype=torch.int32, device=DEVICE)
    scale = dim**-0.5
    out = paged_decode_attention(q, k_cache, v_cache, tables.to(torch.int32), lens, scale)
    tol = 1e-4 if q_dtype == torch.float32 else 3e-2
    for i, n in enumerate(seq_lens):
        want = _reference(q[i : i + 1], k_cache, v_cache, tables[i], n, scale, 0)
        assert torch.allclose(out[i : i + 1].float(), want, atol=tol, rtol=tol)
    # prefill: the last 3 tokens of each sequence over its cached context
    n_q = 3
    qp = torch.randn(n_q * len(seq_lens), heads, dim, generator=gen).to(q_dtype).to(DEVICE)
    starts = torch.arange(0, n_q * len(seq_lens) + 1, n_q, dtype=torch.int32, device=DEVICE)
    out = paged_prefill_attention(qp, k_cache, v_cache, tables.to(torch.int32), starts, lens, scale)
    for i, n in enumerate(seq_lens):
        rows = slice(i * n_q, (i + 1) * n_q)
        want = _reference(qp[rows], k_cache, v_cache, tables[i], n, scale, 0)
        assert torch.allclose(out[rows].float(), want, atol=tol, rtol=tol)


def test_rope_write_kv_into_an_fp8_cache_saturates_at_448():
    heads, kv_heads, dim, bs, t = 4, 2, 64, 16, 5
    gen = torch.Generator().manual_seed(8)
    qkv = torch.randn(t, (heads + 2 * kv_heads) * dim, generator=gen) * 4
    qkv[0, (heads + kv_heads) * dim] = 1000.0  # a v beyond E4M3's range
    qkv[1, (heads + kv_heads) * dim + 1] = -1000.0
    qkv = qkv.to(DEVICE)
    positions = torch.arange(t, device=DEVICE)
    cos = torch.ones(64, dim // 2, device=DEVICE)  # no rotation: k written as it is
    sin = torch.zeros(64, dim // 2, device=DEVICE)
    shape = (4, bs, kv_heads, dim)
    k_cache = torch.zeros(shape, dtype=FP8, device=DEVICE)
    v_cache = torch.zeros(shape, dtype=FP8, device=DEVICE)
    slots = torch.tensor([17, 18, 19, 20, -1], device=DEVICE)  # the last row: padding
    rope_write_kv(qkv, positions, cos, sin, k_cache, v_cache, slots, heads, kv_heads)
    v_flat = v_cache.view(-1, kv_heads, dim).float()
    assert float(v_flat[17, 0, 0]) == 448.0 and float(v_flat[18, 0, 1]) == -448.0
    k = qkv[:4, heads * dim : (heads + kv_heads) * dim].reshape(4, kv_heads, dim)
    want = k.to(FP8).float()  # torch's round-to-nearest-even
    got = k_cache.view(-1, kv_heads, dim)[17:21].float()
    off = got != want
    # the interpreter's own float32 -> E4M3 rounding (test_fp8.py) differs on a few values
    assert int(off.sum()) < 0.05 * got.numel()
    ratio = got[off] / want[off]
    tiny = want[off].abs() <= 2**-9  # E4M3's least subnormal, flushed to 0 there
    assert bool(((ratio >= 0.5) & (ratio <= 2) | tiny).all())
    assert float(k_cache.view(-1, kv_heads, dim)[21:].float().abs().sum()) == 0  # padding


def test_the_backends_choose_or_refuse_an_fp8_cache():
    from scheduler_worker.backends.cpu import CpuBackend
    from scheduler_worker.backends.cuda import CudaBackend

    cuda = CudaBackend(
        torch.bfloat16, 16, num_kv_heads=2, max_num_seqs=4, max_num_batched_tokens=64,
        max_model_len=128, gpu_memory_utilization=0.9, enforce_eager=True,
        device=torch.device("cpu"),
    )  # fmt: skip
    fp8_dtype = cuda.kv_cache_dtype("fp8")
    assert fp8_dtype == FP8
    pool = cuda.allocate_kv_pool(2, (8, 16, 2, 64), fp8_dtype)
    bf16 = cuda.allocate_kv_pool(2, (8, 16, 2, 64), cuda.kv_cache_dtype("auto"))
    assert 2 * pool[0][0].nbytes == bf16[0][0].nbytes  # the same bytes hold twice the tokens
    cpu = CpuBackend.__new__(CpuBackend)  # the dtype rule alone
    cpu.dtype, cpu._decode_kernel = torch.float32, "paged"
    with pytest.raises(ConfigError) as e:
        cpu.kv_cache_dtype("fp8")
    assert "\n" not in str(e.value) and "GPU" in str(e.value)
