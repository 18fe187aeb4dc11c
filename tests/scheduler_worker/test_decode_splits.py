"""The decode step's element-wise ops split across threads (kernels/csrc/decode_ops.cpp,
quant/qlinear.cpp's activation quantizer): the RMSNorm and RoPE + KV write by rows, the
gated activation by pieces of 256 values, the quantizer by blocks of 32 across the rows
(at 33 rows both split inside a row). On 2 threads each gives its 1-thread bits exactly,
at SmolLM2's shapes and at 1, 8 and 33 rows, on every ISA path this CPU has; the float16
KV write (F16C on the vector paths) rounds as torch does. The same chunks run on a decode
step's team (zs_team.h): test_decode_plan.py checks the whole step on 1 and 2 threads.
"""

from __future__ import annotations

import pytest
import torch

from scheduler_worker import kernels
from scheduler_worker.quant.formats import FMT_CODES, from_gguf, pack_blocks
from tests.scheduler_worker.test_kquant_kernels import random_raw

pytestmark = pytest.mark.skipif(not kernels.load(), reason="the C++ kernels are not built here")
ISAS = [
    kernels.isa_index(i)
    for i in kernels.ISAS
    if kernels.load() and kernels.isa_index(i) <= kernels.isa_index(kernels.best_isa())
]
ops = torch.ops.zeroserve
HIDDEN, INTER, H, HKV, D = 576, 1536, 9, 3, 64  # SmolLM2-135M


def _on_threads(threads: int, fn):
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return fn()
    finally:
        torch.set_num_threads(before)


def _same_on_1_and_2_threads(fn):
    one, two = _on_threads(1, fn), _on_threads(2, fn)
    for a, b in zip(one, two, strict=True):
        assert a.dtype == b.dtype and torch.equal(a, b)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("rows", [1, 8, 33])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_norm_and_activations_split_to_the_same_bits(isa, rows, dtype):
    g = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, HIDDEN, generator=g).to(dtype)
    residual = torch.randn(rows, HIDDEN, generator=g).to(dtype)
    w = torch.randn(HIDDEN, generator=g).to(dtype)
    gate_up = (3 * torch.randn(rows, 2 * INTER, generator=g)).to(dtype)

    def run():
        r = residual.clone()
        y = ops.rms_norm(x, r, w, 1e-5, isa)
        return y, r, ops.silu_mul(gate_up, isa), ops.gelu_tanh_mul(gate_up, isa)

    _same_on_1_and_2_threads(run)
    _, r, silu, _ = run()
    ref = residual.float() + x.float()
    assert torch.equal(r, ref.to(dtype))  # the residual updated in place
    g_, u = gate_up.float().chunk(2, -1)
    torch.testing.assert_close(silu.float(), torch.nn.functional.silu(g_) * u, rtol=2e-2, atol=1e-2)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("rows", [1, 8, 32])
@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.float16])
def test_rope_and_kv_write_split_to_the_same_bits(isa, rows, cache_dtype):
    g = torch.Generator().manual_seed(rows)
    qkv = torch.randn(rows, (H + 2 * HKV) * D, generator=g)
    cos, sin = torch.randn(512, D // 2, generator=g), torch.randn(512, D // 2, generator=g)
    positions = torch.randperm(512, generator=g)[:rows]
    slots = torch.randperm(40 * 16, generator=g)[:rows]
    cache = torch.zeros(40, 16, HKV, D, dtype=cache_dtype)

    def run():
        k_cache, v_cache = cache.clone(), cache.clone()
        q, k = ops.rope_write_kv(qkv, positions, cos, sin, k_cache, v_cache, slots, H, HKV, isa)
        return q, k, k_cache, v_cache

    _same_on_1_and_2_threads(run)
    _, k, k_cache, v_cache = run()
    # the cache holds k and v rounded to its dtype, as torch rounds them (F16C or not)
    assert torch.equal(k_cache.view(-1, HKV, D)[slots], k.to(cache_dtype))
    v = qkv[:, (H + HKV) * D :].reshape(rows, HKV, D)
    assert torch.equal(v_cache.view(-1, HKV, D)[slots], v.to(cache_dtype))


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("rows", [1, 8, 33])
def test_activation_quantizer_splits_by_blocks_to_the_same_bits(isa, rows):
    """The quantizer alone (quantize_act) and inside a Q6_K linear, whose per-piece offsets
    it computes in the same tasks; at 33 rows of K 1536 (48 blocks a row) the 2 threads'
    halves meet inside row 16."""
    g = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, INTER, generator=g)
    n = 80
    bw = from_gguf(random_raw("Q6_K", n, INTER, rows), "Q6_K", n, INTER)
    packed = pack_blocks(bw)

    def run():
        return (*ops.quantize_act(x, isa), ops.qlinear(x, *packed, FMT_CODES[bw.form], n, isa))

    _same_on_1_and_2_threads(run)
    q, d, _, _ = run()
    # each block on its own: quantizing row by row gives the same blocks
    for i in range(rows):
        qi, di, _ = ops.quantize_act(x[i : i + 1], isa)
        assert torch.equal(qi, q[i : i + 1]) and torch.equal(di, d[i : i + 1])
