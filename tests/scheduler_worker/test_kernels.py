"""The C++ CPU kernels against their pure-torch oracles: every ISA path this machine has
(the portable scalar path always among them), every block form, batches 1 to 64, shapes
whose tails are not a multiple of the block, the vector width or the tile."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from common.env import cpu_kind_override
from scheduler_worker import kernels
from scheduler_worker.attention import _decode_attention, write_kv
from scheduler_worker.quant.formats import (
    BlockWeight,
    from_gguf,
    pack_blocks,
    quantize_activations,
    reference_qlinear,
)
from scheduler_worker.rope import rotate
from tests.conftest import kernels_built

pytestmark = pytest.mark.skipif(not kernels_built(), reason="the C++ kernels are not built here")
ISAS = [
    i
    for i in kernels.ISAS
    if kernels.load() and kernels.isa_index(i) <= kernels.isa_index(kernels.best_isa())
]
ops = torch.ops.zeroserve


def _gguf_weight(type_name: str, n: int, k: int, seed: int):
    rng = np.random.default_rng(seed)
    w = rng.normal(0, 0.05, (n, k)).astype(np.float32)
    raw = gguf.quants.quantize(w, gguf.GGMLQuantizationType[type_name])
    return from_gguf(raw, type_name, n, k)


def test_scalar_path_is_always_there_and_best_isa_matches_the_flags(each_cpu_kind):
    best = kernels.isa_index(kernels.best_isa())
    assert ISAS[0] == "scalar"
    # the C++ probe reads the real CPU; an emulated avx2 kind only lowers the choice
    if cpu_kind_override() is None:
        assert ops.cpu_isa() == best and ISAS[-1] == kernels.best_isa()
    else:
        assert each_cpu_kind == "avx2" and best == kernels.isa_index("avx2") <= ops.cpu_isa()


def _qlinear(x: torch.Tensor, bw: BlockWeight, isa: str) -> torch.Tensor:
    """The kernel of path `isa` on `bw`, repacked into the kernels' layout."""
    return ops.qlinear(
        x, *pack_blocks(bw), 0 if bw.form == "q4" else 1, bw.shape[0], kernels.isa_index(isa)
    )


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("type_name", ["Q4_0", "Q4_1", "Q8_0"])
def test_qlinear_equals_the_oracle(isa, type_name):
    # K = 32 (one block), 96 (odd block count), 576, 1536; N not a multiple of a tile's
    # rows (2-4, or a group of 16 for AVX-512: 5, 13, 37, 40 pad the last group, 64 fills
    # 4 groups, 9 a single short one); M from 1 to 64 (tiles of 3/4 rows plus tails)
    shapes = [
        (1, 5, 32),
        (2, 37, 96),
        (3, 64, 576),
        (7, 13, 160),
        (16, 40, 1536),
        (64, 9, 64),
        (5, 80, 64),
        (37, 40, 544),  # AMX: two slabs of 16 rows (17 blocks, odd) and 5 rows on VNNI
        (48, 33, 96),  # three slabs, 3 groups: a pair and a lone one
    ]
    for seed, (m, n, k) in enumerate(shapes):
        bw = _gguf_weight(type_name, n, k, seed)
        x = torch.randn(m, k, generator=torch.Generator().manual_seed(seed))
        ref = reference_qlinear(x, bw)
        y = _qlinear(x, bw, isa)
        assert y.dtype == torch.float32 and y.shape == (m, n)
        torch.testing.assert_close(y.double(), ref, rtol=1e-5, atol=1e-5 * ref.abs().max().item())
        yb = _qlinear(x.bfloat16(), bw, isa)
        refb = reference_qlinear(x.bfloat16().float(), bw)
        assert yb.dtype == torch.bfloat16
        torch.testing.assert_close(
            yb.double(), refb, rtol=1e-2, atol=1e-2 * refb.abs().max().item()
        )


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("type_name", ["Q4_1", "Q8_0"])
def test_a_row_computes_the_same_whatever_the_batch(isa, type_name):
    # every tile shape and path (VNNI row tiles of 1-4 rows; on AMX the 8-bit format's
    # slabs of 16 rows from 16 rows on, the rest on VNNI) gives each row bit for bit what it
    # gives alone; N 37 and 50 end in a lone group, K 544 has an odd block count
    for seed, n in enumerate((37, 50)):
        bw = _gguf_weight(type_name, n, 544, seed)
        x = torch.randn(100, 544, generator=torch.Generator().manual_seed(seed))
        alone = torch.cat([_qlinear(x[i : i + 1], bw, isa) for i in range(100)])
        for m in (2, 3, 6, 8, 11, 15, 16, 17, 31, 32, 37, 64, 100):
            assert torch.equal(_qlinear(x[:m], bw, isa), alone[:m]), (m, n)


@pytest.mark.skipif("amx" not in ISAS, reason="no AMX (or no OS permission for it) here")
@pytest.mark.parametrize("type_name", ["Q8_0", "Q4_0"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_amx_path_gives_the_vnni_outputs_bit_for_bit(type_name, dtype):
    # the 8-bit format's AMX slabs keep the VNNI tiles' epilogue operation for operation
    # (csrc/quant/arch/amx/amx.h); the 4-bit one has no AMX path and must be untouched by the kind
    for seed, (m, n, k) in enumerate([(16, 40, 1536), (33, 37, 96), (64, 200, 576), (100, 9, 32)]):
        bw = _gguf_weight(type_name, n, k, seed)
        x = torch.randn(m, k, generator=torch.Generator().manual_seed(seed)).to(dtype)
        assert torch.equal(_qlinear(x, bw, "amx"), _qlinear(x, bw, "avx512")), (m, n, k)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("type_name", ["Q4_0", "Q4_1", "Q8_0"])
def test_qlinear_argmax_is_the_index_max_gives_on_qlinears_outputs(isa, type_name):
    # the fused head argmax (chunks of 1,024 outputs: 2,500 make two and a short one)
    # against max(dim=-1) of qlinear's own outputs, float32 and bfloat16, rows on every
    # tile shape; n cut inside a group or at a chunk's end; ties (duplicated weight rows:
    # the first index wins, also across chunks); +-inf and NaN (float16 scales of inf)
    n_out, k = 2500, 96
    x = torch.randn(64, k, generator=torch.Generator().manual_seed(1))
    w = torch.randn(n_out, k, generator=torch.Generator().manual_seed(2)) * 0.05
    w[[100, 1900, 2100]] = x[0] * 0.5  # row 0: a three-way tie, won by 100
    w[[1500, 2400]] = x[1] * 0.5  # row 1: a tie across chunks, won by 1500
    raw = gguf.quants.quantize(w.numpy(), gguf.GGMLQuantizationType[type_name])
    qs, d, m = pack_blocks(from_gguf(raw, type_name, n_out, k))
    fmt, i = 0 if type_name != "Q8_0" else 1, kernels.isa_index(isa)
    clean = d.clone()
    d[[40, 150], :2, [3, 7]] = float("inf")  # outputs 643 and 2407: +-inf, or NaN (inf - inf)
    d[20, :, 5] = float("inf")  # output 325
    seen_nan = seen_inf = False
    for dtype in (torch.float32, torch.bfloat16):
        for rows in (1, 2, 5, 16, 17, 37, 64):
            xs = x[:rows].to(dtype)
            y = ops.qlinear(xs, qs, d, m, fmt, n_out, i)
            for n in (n_out, 2487, 1024, 17):
                got = ops.qlinear_argmax(xs, qs, d, m, fmt, n, i)
                assert got.dtype == torch.int64
                assert torch.equal(got, y[:, :n].max(dim=-1).indices), (dtype, rows, n)
            seen_nan |= bool(y.isnan().any(dim=-1).any())
            seen_inf |= bool((y.max(dim=-1).values == float("inf")).any())
    assert seen_nan and seen_inf  # the cases the test means to cover did occur
    got = ops.qlinear_argmax(x[:2], qs, clean, m, fmt, n_out, i)
    assert got.tolist() == [100, 1500]
    with pytest.raises(RuntimeError, match="outputs asked"):
        ops.qlinear_argmax(x[:2], qs, d, m, fmt, 2513, i)  # 157 groups: 2,512 outputs


@pytest.mark.parametrize("isa", ISAS)
def test_activation_quantization_equals_the_oracle(isa):
    x = torch.randn(5, 160) * torch.logspace(-3, 2, 160)  # very different block ranges
    x[1, 32:64] = 0.0  # an all-zero block: d = 0, q = 0
    q, d, s = ops.quantize_act(x, kernels.isa_index(isa))
    q_ref, d_ref, s_ref = quantize_activations(x)
    torch.testing.assert_close(d, d_ref, rtol=1e-6, atol=0)
    # x / d lands within float rounding of .5 now and then: one step apart at most
    assert (q.int() - q_ref.int()).abs().max() <= 1 and (q != q_ref).float().mean() < 0.01
    assert torch.equal(q[1, 32:64], torch.zeros(32, dtype=torch.int8)) and d[1, 1] == 0
    torch.testing.assert_close(s, d * q.float().reshape(5, -1, 32).sum(-1))


def test_qlinear_refuses_bad_shapes():
    bw = _gguf_weight("Q4_1", 20, 64, 0)
    qs, d, m = pack_blocks(bw)
    with pytest.raises(RuntimeError, match="does not match"):
        ops.qlinear(torch.randn(2, 96), qs, d, m, 0, 20, 0)
    with pytest.raises(RuntimeError, match="needs m"):
        ops.qlinear(torch.randn(2, 64), qs, d, None, 0, 20, 0)
    with pytest.raises(RuntimeError, match="do not fit"):
        ops.qlinear(torch.randn(2, 64), qs, d, m, 0, 16, 0)  # 20 rows make 2 groups: 17-32
    with pytest.raises(RuntimeError, match="wrong shape"):
        ops.qlinear(torch.randn(2, 64), bw.qs, d, m, 0, 20, 0)  # not repacked


def test_pack_blocks_interleaves_16_rows_4_bytes_at_a_time():
    """Where one weight byte lands: group g, block b, register k, row r, byte j."""
    for type_name, bytes_per_block in (("Q4_1", 16), ("Q8_0", 32)):
        bw = _gguf_weight(type_name, 20, 64, 3)  # 2 groups (the second padded), 2 blocks
        qs, d, m = pack_blocks(bw)
        nat = bw.qs.view(torch.uint8)
        packed = qs.view(2, 2, bytes_per_block // 4, 16, 4)
        offset = 0 if type_name == "Q4_1" else 128  # 8-bit values are stored + 128
        for n, b, k, j in ((0, 0, 0, 0), (17, 1, 3, 2), (5, 1, bytes_per_block // 4 - 1, 3)):
            want = (int(nat[n, b * bytes_per_block + 4 * k + j]) + offset) % 256
            assert int(packed[n // 16, b, k, n % 16, j]) == want
            assert d[n // 16, b, n % 16] == bw.d[n, b]
        assert (d[1, :, 4:] == 0).all()  # padded rows
        assert (m is None) == (type_name == "Q8_0")


def _paged(batch: int, lens: list[int], bs: int, h: int, hkv: int, d: int, dtype, seed: int):
    g = torch.Generator().manual_seed(seed)
    per_seq = [(n + bs - 1) // bs for n in lens]
    num_blocks = sum(per_seq) + 3
    kc = torch.randn(num_blocks, bs, hkv, d, generator=g).to(dtype)
    vc = torch.randn(num_blocks, bs, hkv, d, generator=g).to(dtype)
    perm = torch.randperm(num_blocks - 1, generator=g) + 1  # scattered blocks, 0 unused
    width = max(per_seq)
    tables, start = torch.zeros(batch, width, dtype=torch.long), 0
    for i, nb in enumerate(per_seq):
        tables[i, :nb] = perm[start : start + nb]
        start += nb
    q = torch.randn(batch, h, d, generator=g).to(dtype)
    return q, kc, vc, tables


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "case",
    [
        (1, [1], 16, 9, 3, 64),
        (3, [17, 40, 5], 16, 4, 2, 128),
        (5, [33, 1, 64, 100, 7], 4, 6, 6, 32),
        (2, [300, 250], 16, 8, 1, 80),
        (2, [37, 70], 16, 16, 1, 64),  # 16 query heads per KV head
        (3, [5, 20, 9], 8, 24, 2, 256),  # 12 per KV head, head_dim 256
        (1, [50], 16, 4, 1, 512),  # head_dim 512
        (2, [3, 18], 4, 3, 3, 6),  # a tiny head
    ],
)
def test_paged_decode_attention_equals_the_gathered_torch_path(dtype, case, isa):
    batch, lens, bs, h, hkv, d = case
    q, kc, vc, tables = _paged(batch, lens, bs, h, hkv, d, dtype, seed=len(lens))
    _check_paged_attention(q, kc, vc, tables, lens, isa)


def _check_paged_attention(q, kc, vc, tables, lens, isa) -> None:
    batch, bs, d, dtype = q.shape[0], kc.shape[1], q.shape[2], q.dtype
    ctx = torch.tensor(lens)
    mask = (torch.arange(tables.shape[1] * bs)[None, :] < ctx[:, None]).view(batch, 1, 1, -1)
    ref = _decode_attention(q.float(), kc.float(), vc.float(), tables, mask, d**-0.5, "sdpa")
    out = ops.paged_decode_attention(q, kc, vc, tables, ctx, d**-0.5, kernels.isa_index(isa))
    assert out.dtype == dtype and out.shape == q.shape
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out.float(), ref, rtol=tol, atol=tol)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize(
    "case",
    [
        (3, [17, 40, 5], 16, 9, 3, 64),
        (8, [1, 5, 16, 17, 33, 64, 100, 200], 16, 9, 3, 64),  # tasks of whole sequences
        (2, [300, 1], 16, 8, 1, 128),
        (2, [37, 70], 8, 4, 2, 256),
        (2, [9, 4], 4, 3, 3, 6),
    ],
)
def test_paged_decode_attention_reads_float16_caches_under_float32(case, isa):
    """The float16 KV cache of float32 models (--kv-cache-dtype auto): the kernel widens
    each cached value exactly, so it equals the float32 path over the same rounded values;
    q and the output stay float32."""
    batch, lens, bs, h, hkv, d = case
    q, kc, vc, tables = _paged(batch, lens, bs, h, hkv, d, torch.float32, seed=len(lens))
    kc, vc = kc.to(torch.float16), vc.to(torch.float16)
    _check_paged_attention(q, kc, vc, tables, lens, isa)
    with pytest.raises(RuntimeError, match="float16 caches"):
        ops.paged_decode_attention(q.bfloat16(), kc, vc, tables, torch.tensor(lens), 0.1, 0)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize(
    "case",
    [
        (4, [70, 33, 200, 9], 16, 9, 3, 64, 40),  # windows that start inside a block
        (2, [300, 129], 16, 4, 1, 256, 128),  # Gemma 3's head: one KV head of 256
        (3, [50, 17, 90], 8, 8, 4, 128, 23),
    ],
)
def test_paged_decode_attention_keeps_to_the_sliding_window(case, isa):
    """A window of W keys: only positions L - W .. L - 1 are attended (the first block's
    earlier keys skipped), on float16 caches under float32 as the models run them."""
    batch, lens, bs, h, hkv, d, window = case
    q, kc, vc, tables = _paged(batch, lens, bs, h, hkv, d, torch.float32, seed=window)
    kc, vc = kc.to(torch.float16), vc.to(torch.float16)
    ctx = torch.tensor(lens)
    pos = torch.arange(tables.shape[1] * bs)[None, :]
    mask = ((pos < ctx[:, None]) & (pos >= ctx[:, None] - window)).view(batch, 1, 1, -1)
    ref = _decode_attention(q, kc.float(), vc.float(), tables, mask, d**-0.5, "sdpa")
    i = kernels.isa_index(isa)
    out = ops.paged_decode_attention(q, kc, vc, tables, ctx, d**-0.5, i, window)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    full = ops.paged_decode_attention(q, kc, vc, tables, ctx, d**-0.5, i, 0)
    assert not torch.allclose(out[2 if batch > 2 else 0], full[2 if batch > 2 else 0])


def test_paged_decode_attention_refuses_a_length_past_its_table():
    q, kc, vc, tables = _paged(1, [20], 16, 4, 2, 32, torch.float32, 0)
    with pytest.raises(RuntimeError, match="outside its block table"):
        ops.paged_decode_attention(q, kc, vc, tables, torch.tensor([33]), 1.0, 0)


@pytest.mark.parametrize("isa", ISAS)
def test_paged_decode_attention_refuses_a_block_id_outside_the_cache(isa):
    """Every block id a sequence's length reaches is checked before any is read: a bad one
    raises instead of reading outside the cache; ids past the length are never read."""
    q, kc, vc, tables = _paged(2, [20, 9], 16, 4, 2, 32, torch.float32, 0)
    ctx, i = torch.tensor([20, 9]), kernels.isa_index(isa)
    for bad in (kc.shape[0], 10**12, -1):
        t = tables.clone()
        t[0, 1] = bad  # the second block of a 20-token sequence
        with pytest.raises(RuntimeError, match=f"block id {bad} of sequence 0 outside"):
            ops.paged_decode_attention(q, kc, vc, t, ctx, 1.0, i)
    t = tables.clone()
    t[1, 1] = 10**12  # past sequence 1's 9 tokens: not read, not refused
    ref = ops.paged_decode_attention(q, kc, vc, tables, ctx, 1.0, i)
    assert torch.equal(ops.paged_decode_attention(q, kc, vc, t, ctx, 1.0, i), ref)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_with_and_without_residual(dtype, isa):
    i = kernels.isa_index(isa)
    x = torch.randn(7, 576).to(dtype)
    res = torch.randn(7, 576).to(dtype)
    w = (torch.rand(576) + 0.5).to(dtype)

    def ref(v):
        f = v.float()
        return w * (f * torch.rsqrt(f.pow(2).mean(-1, keepdim=True) + 1e-5)).to(dtype)

    tol = 1e-5 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(ops.rms_norm(x, None, w, 1e-5, i), ref(x), rtol=tol, atol=tol)
    expected_res = x + res
    got_res = res.clone()
    y = ops.rms_norm(x, got_res, w, 1e-5, i)
    torch.testing.assert_close(got_res, expected_res, rtol=0, atol=0)  # residual += x, in place
    torch.testing.assert_close(y, ref(expected_res), rtol=tol, atol=tol)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_silu_mul(dtype, isa):
    gu = (torch.randn(5, 2 * 1537) * 4).to(dtype)  # an odd width: a vector tail
    gate, up = gu.float().chunk(2, dim=-1)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(
        ops.silu_mul(gu, kernels.isa_index(isa)).float(),
        torch.nn.functional.silu(gate) * up,
        rtol=tol,
        atol=tol,
    )


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize(
    "dtype,cache_dtype",
    [
        (torch.float32, torch.float32),
        (torch.bfloat16, torch.bfloat16),
        (torch.float32, torch.float16),
    ],
)
def test_rope_write_kv_equals_rotate_and_write(dtype, cache_dtype, isa):
    """q and k rotated as torch does; k and v written as write_kv writes them (a float16
    cache under float32: each value rounded once, as torch's .to(float16))."""
    i = kernels.isa_index(isa)
    h, hkv, d, bs, t = 9, 3, 64, 16, 11
    qkv = torch.randn(t, (h + 2 * hkv) * d).to(dtype)
    positions = torch.tensor([0, 1, 2, 3, 4, 5, 6, 7, 8, 130, 131])
    freqs = torch.outer(
        torch.arange(200).float(), 1.0 / 10000 ** (torch.arange(0, d, 2).float() / d)
    )
    cos, sin = freqs.cos(), freqs.sin()
    slots = torch.randperm(8 * bs)[:t]
    kc = torch.zeros(8, bs, hkv, d, dtype=cache_dtype)
    vc = torch.zeros(8, bs, hkv, d, dtype=cache_dtype)
    q, k = ops.rope_write_kv(qkv, positions, cos, sin, kc, vc, slots, h, hkv, i)
    qk = qkv[:, : (h + hkv) * d].float().view(t, h + hkv, d)
    rot = rotate(qk, cos[positions].unsqueeze(1), sin[positions].unsqueeze(1))
    tol = 1e-6 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(q.float(), rot[:, :h], rtol=tol, atol=tol)
    torch.testing.assert_close(k.float(), rot[:, h:], rtol=tol, atol=tol)
    kr, vr = torch.zeros_like(kc), torch.zeros_like(vc)
    write_kv(kr, vr, k, qkv[:, (h + hkv) * d :].view(t, hkv, d), slots)
    assert torch.equal(kc, kr) and torch.equal(vc, vr)
    assert kc.abs().sum() > 0  # written
    with pytest.raises(RuntimeError, match="out of range"):
        ops.rope_write_kv(qkv, positions + 100, cos, sin, kc, vc, slots, h, hkv, i)
