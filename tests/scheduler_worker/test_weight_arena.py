"""The weight arena: packed weights copied onto huge-page-advised memory keep every byte,
dtype, shape and a 64-byte alignment, across chunks; the maps are THP-eligible where the
system allows; a kernel-path QuantLinear reads its weights from there and computes what a
copy of the same bytes in ordinary memory computes, its d and m interleaved (hold_scales)
on every ISA path, bit for bit."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from scheduler_worker import kernels
from scheduler_worker.quant import weight_arena
from scheduler_worker.quant.formats import (
    FMT_CODES,
    from_gguf,
    pack_blocks,
    quantize_q4,
    quantize_q8,
)
from scheduler_worker.quant.linear import QuantLinear
from scheduler_worker.quant.weight_arena import HUGE_PAGE, WeightArena
from tests.conftest import kernels_built
from tests.scheduler_worker.test_kquant_kernels import ISAS, random_raw

ops = torch.ops.zeroserve


def _smaps_entry(ptr: int) -> dict[str, str]:
    """The /proc/self/smaps fields of the mapping holding address `ptr`."""
    entry: dict[str, str] = {}
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0]
        if "-" in head and ":" not in head:
            lo, hi = (int(x, 16) for x in head.split("-"))
            if inside:
                break
            inside = lo <= ptr < hi
        elif inside:
            key, _, value = line.partition(":")
            entry[key] = value.strip()
    return entry


def test_hold_keeps_bytes_dtype_shape_and_alignment_across_chunks():
    arena = WeightArena(chunk_bytes=HUGE_PAGE)
    torch.manual_seed(0)
    tensors = [
        torch.randint(-(2**31), 2**31 - 1, (30_000 + 977 * i,), dtype=torch.int32)
        for i in range(40)
    ]
    tensors += [torch.randn(7, 33).half(), torch.empty(0, dtype=torch.float16)]
    tensors += [torch.randint(0, 255, (3 * HUGE_PAGE + 5,), dtype=torch.uint8)]  # > a chunk
    held = [arena.hold(t) for t in tensors]
    for t, h in zip(tensors, held, strict=True):
        assert h.dtype == t.dtype and h.shape == t.shape and h.is_contiguous()
        assert torch.equal(h, t)
        assert h.data_ptr() % 64 == 0
    chunks = {h.untyped_storage().data_ptr() for h in held if h.numel()}
    assert len(chunks) >= 3  # 8 MB of small ones in 2 MB chunks; the big one takes its own
    # no two holds overlap
    spans = sorted(
        (h.data_ptr(), h.data_ptr() + h.numel() * h.element_size()) for h in held if h.numel()
    )
    assert all(a_end <= b_start for (_, a_end), (b_start, _) in zip(spans, spans[1:]))


def test_arena_maps_are_huge_page_eligible():
    mode = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    if not mode.exists() or "[never]" in mode.read_text() or not Path("/proc/self/smaps").exists():
        pytest.skip("no transparent huge pages on this system")
    held = WeightArena(chunk_bytes=HUGE_PAGE).hold(torch.ones(HUGE_PAGE, dtype=torch.uint8))
    assert held.data_ptr() % HUGE_PAGE == 0  # the chunk starts on a huge page
    entry = _smaps_entry(held.data_ptr())
    assert entry.get("THPeligible") == "1"


@pytest.mark.skipif(not kernels_built(), reason="needs the C++ kernels")
def test_kernel_quant_linear_reads_the_arena_and_computes_as_before():
    torch.manual_seed(1)
    w = torch.randn(96, 256) * 0.05
    bw = quantize_q8(w)
    layer = QuantLinear(bw, None, torch.float32, kernels.best_isa())
    probe = weight_arena.hold(torch.zeros(1, dtype=torch.uint8))  # the arena's current chunk
    assert layer.qs.untyped_storage().data_ptr() == probe.untyped_storage().data_ptr()
    x = torch.randn(5, 256)
    want = layer(x)
    # the same bytes in torch's own memory
    layer.qs, layer.d = layer.qs.clone(), layer.d.clone()
    assert layer.qs.untyped_storage().data_ptr() != probe.untyped_storage().data_ptr()
    assert torch.equal(layer(x), want)


def test_hold_scales_interleaves_d_and_m_unit_by_unit():
    d, m = torch.randn(3, 5, 16).half(), torch.randn(3, 5, 16).half()
    hd, hm = weight_arena.hold_scales(d, m)
    assert hm is not None and torch.equal(hd, d) and torch.equal(hm, m)
    assert hd.stride() == hm.stride() == (5 * 32, 32, 1)
    assert hm.data_ptr() == hd.data_ptr() + 32  # m's 16 halves right after d's, per unit
    only_d, none = weight_arena.hold_scales(d, None)
    assert none is None and only_d.is_contiguous() and torch.equal(only_d, d)


def _weights_with_m():
    """Q4_1 (quantized here), Q5_1, Q4_K and Q5_K (random GGUF blocks), with tails in N."""
    torch.manual_seed(3)
    yield quantize_q4(torch.randn(40, 96) * 0.05)
    yield from_gguf(random_raw("Q5_1", 37, 160, 4), "Q5_1", 37, 160)
    for t in ("Q4_K", "Q5_K"):
        yield from_gguf(random_raw(t, 21, 512, 5), t, 21, 512)


@pytest.mark.skipif(not kernels_built(), reason="needs the C++ kernels")
@pytest.mark.parametrize("isa", ISAS)
def test_interleaved_scales_compute_what_separate_ones_compute(isa):
    for bw in _weights_with_m():
        layer = QuantLinear(bw, None, torch.float32, isa)
        assert layer.m is not None and layer.m.data_ptr() == layer.d.data_ptr() + 32
        qs, d, m = pack_blocks(bw)
        assert d.is_contiguous() and m is not None and m.is_contiguous()
        fmt, n, i = FMT_CODES[bw.form], bw.shape[0], kernels.isa_index(isa)
        for rows in (1, 2, 3, 4, 5, 8):  # the 1-row tile, pairs, the half-group tiles
            x = torch.randn(rows, bw.shape[1])
            assert torch.equal(layer(x), ops.qlinear(x, qs, d, m, fmt, n, i)), (bw.form, rows)
            assert torch.equal(
                ops.qlinear_argmax(x, layer.qs, layer.d, layer.m, fmt, n, i),
                ops.qlinear_argmax(x, qs, d, m, fmt, n, i),
            )


@pytest.mark.skipif(not kernels_built(), reason="needs the C++ kernels")
def test_qlinear_refuses_scales_in_any_other_layout():
    bw = quantize_q4(torch.randn(32, 64))
    qs, d, m = pack_blocks(bw)
    assert m is not None
    x, fmt = torch.randn(1, 64), FMT_CODES[bw.form]
    apart = torch.stack((d, m), dim=2)
    with pytest.raises(RuntimeError, match="interleaved|halves"):  # m not right after d
        ops.qlinear(x, qs, apart[:, :, 1], apart[:, :, 0], fmt, 32, 0)
    with pytest.raises(RuntimeError, match="interleaved|halves"):  # d strided, m contiguous
        ops.qlinear(x, qs, apart[:, :, 0], m, fmt, 32, 0)
