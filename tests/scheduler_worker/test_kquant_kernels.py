"""The 5-bit and K-quant kernels (GGUF Q5_0, Q5_1, Q4_K, Q5_K; scheduler_worker/quant/
kquants.py, kernels/csrc/quant/; Q6_K: quant/q6k.py, csrc/quant/formats.h)
against gguf-py: blocks of random bytes
with sane float16 scales, dequantized by gguf-py's own code, multiplied in float64 by the
activations quantized as the kernels quantize them (int8 per block of 32). Every ISA path
this machine has plus the portable one; tails in N, K and the batch."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from scheduler_worker import kernels
from scheduler_worker.quant.formats import (
    FMT_CODES,
    GGUF_BLOCK_TYPES,
    BlockWeight,
    cat_rows,
    dequantize,
    from_gguf,
    pack_blocks,
    quantize_activations,
    reference_qlinear,
)
from scheduler_worker.quant.linear import QuantLinear
from tests.conftest import fused_and_module_decode

TYPES = ["Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K"]
ISAS = [
    i
    for i in kernels.ISAS
    if kernels.load() and kernels.isa_index(i) <= kernels.isa_index(kernels.best_isa())
]
needs_kernels = pytest.mark.skipif(not kernels.load(), reason="the C++ kernels are not built here")
ops = torch.ops.zeroserve


def _unit(type_name: str) -> int:
    return 256 if type_name.endswith("_K") else 32


def random_raw(type_name: str, n: int, k: int, seed: int) -> np.ndarray:
    """[n, row bytes] of random blocks: every byte random but the float16 d (and m / dmin),
    set to finite values of either sign across two decades (Q6_K: its d, the last two
    bytes; its int8 sub-scales stay random, of either sign)."""
    rng = np.random.default_rng(seed)
    size, unit = GGUF_BLOCK_TYPES[type_name][1], _unit(type_name)
    blocks = rng.integers(0, 256, (n, k // unit, size), dtype=np.uint8)
    nf = 1 if type_name in ("Q5_0", "Q6_K") else 2
    f = rng.uniform(0.5, 1.0, (n, k // unit, nf)) * 10.0 ** rng.uniform(-4, -2, (n, k // unit, nf))
    f *= rng.choice([-1.0, 1.0], f.shape)
    at = size - 2 if type_name == "Q6_K" else 0
    f16 = f.astype(np.float16).view(np.uint8).reshape(n, k // unit, 2 * nf)
    blocks[..., at : at + 2 * nf] = f16
    return blocks.reshape(n, -1)


def gguf_oracle(x: torch.Tensor, raw: np.ndarray, type_name: str, n: int, k: int) -> torch.Tensor:
    """gguf-py's dequantized weight times the kernels' quantized activations, in float64."""
    w = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[type_name]).reshape(n, k)
    q, d, _ = quantize_activations(x)
    xq = q.double().reshape(x.shape[0], -1, 32) * d.double()[..., None]
    return xq.reshape(x.shape) @ torch.from_numpy(w).double().T


def _qlinear(x: torch.Tensor, bw: BlockWeight, isa: str) -> torch.Tensor:
    return ops.qlinear(x, *pack_blocks(bw), FMT_CODES[bw.form], bw.shape[0], kernels.isa_index(isa))


@pytest.mark.parametrize("type_name", TYPES)
def test_from_gguf_keeps_every_value(type_name):
    n, k = 21, 2 * _unit(type_name) * 3
    raw = random_raw(type_name, n, k, 1)
    bw = from_gguf(raw, type_name, n, k)
    assert bw.shape == (n, k) and bw.form == GGUF_BLOCK_TYPES[type_name][0]
    expected = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[type_name])
    assert torch.equal(dequantize(bw), torch.from_numpy(expected.reshape(n, k)))  # bit for bit


@pytest.mark.parametrize("type_name", TYPES)
def test_packed_bytes_within_1_1x_of_the_file(type_name):
    for n, k in ((576, 1536), (1536, 576 if type_name in ("Q5_0", "Q5_1") else 512), (4096, 4096)):
        raw = random_raw(type_name, n, k, 2)
        bw = from_gguf(raw, type_name, n, k)
        packed = pack_blocks(bw)
        got = sum(t.numel() * t.element_size() for t in packed if t is not None)
        assert got == bw.nbytes() <= 1.1 * raw.nbytes, (n, k, got, raw.nbytes)
        if type_name == "Q6_K":  # whole groups of 16 rows: exactly the file's bytes
            assert got == raw.nbytes


def test_k_types_refuse_a_row_not_a_multiple_of_256():
    with pytest.raises(ValueError, match="multiple of 256"):
        from_gguf(np.zeros((2, 144), np.uint8), "Q4_K", 2, 224)
    with pytest.raises(ValueError, match="multiple of 256"):
        from_gguf(np.zeros((2, 210), np.uint8), "Q6_K", 2, 224)


@needs_kernels
@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("type_name", TYPES)
def test_qlinear_equals_the_gguf_oracle(isa, type_name):
    # N: a single short group (5, 9, 13), padded (37, 40), whole (64, 80); K: one unit,
    # odd unit counts, for Q5_0 / Q5_1 rows that are not a multiple of 256 (as the files'
    # fallback tensors are); M 1..64: tiles of 2 (AVX2) / 4 (VNNI, under 8 rows) / 8 (VNNI)
    # rows and their tails (13 = 8 + 4 + 1, 15 = 8 + 4 + 3)
    unit = _unit(type_name)
    shapes = [(1, 5, 1), (2, 37, 3), (3, 64, 2), (7, 13, 5), (16, 40, 6), (64, 9, 1), (5, 80, 9)]
    shapes += [(13, 37, 3), (15, 24, 2)]
    if unit == 32:
        shapes += [(4, 24, 49), (33, 17, 18)]  # K = 1568, 576
    for seed, (m, n, units) in enumerate(shapes):
        k = units * unit
        raw = random_raw(type_name, n, k, seed)
        bw = from_gguf(raw, type_name, n, k)
        x = torch.randn(m, k, generator=torch.Generator().manual_seed(seed))
        ref = gguf_oracle(x, raw, type_name, n, k)
        # (the block sums s = d * sum(q) are float32 there, as in the kernels)
        scale = ref.abs().max().item()
        torch.testing.assert_close(reference_qlinear(x, bw), ref, rtol=1e-6, atol=1e-6 * scale)
        y = _qlinear(x, bw, isa)
        assert y.dtype == torch.float32 and y.shape == (m, n)
        torch.testing.assert_close(y.double(), ref, rtol=1e-5, atol=1e-5 * ref.abs().max().item())
        yb = _qlinear(x.bfloat16(), bw, isa)
        refb = gguf_oracle(x.bfloat16().float(), raw, type_name, n, k)
        assert yb.dtype == torch.bfloat16
        torch.testing.assert_close(
            yb.double(), refb, rtol=1e-2, atol=1e-2 * refb.abs().max().item()
        )


@needs_kernels
@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("type_name", TYPES)
def test_a_row_computes_the_same_whatever_the_batch(isa, type_name):
    # every tile shape and path (row tiles of 1-8 rows; on AVX-512 the 5-bit formats' panel
    # from 32 rows, csrc/quant/arch/avx512/panel.h) gives each row bit for bit what it gives alone, so a
    # request's numbers do not depend on how many rows share its step; N 37 and 50 end in
    # a lone group (3 and 4 groups), K 576 is not a multiple of 256 (Q5_0 / Q5_1 only); up
    # to 64 rows the activations are quantized into the thread's scratch, 100 allocates
    k = 512 if type_name.endswith("_K") else 576
    for seed, n in enumerate((37, 50)):
        raw = random_raw(type_name, n, k, seed)
        bw = from_gguf(raw, type_name, n, k)
        x = torch.randn(100, k, generator=torch.Generator().manual_seed(seed))
        alone = torch.cat([_qlinear(x[i : i + 1], bw, isa) for i in range(100)])
        for m in (2, 8, 13, 31, 32, 33, 64, 100):
            assert torch.equal(_qlinear(x[:m], bw, isa), alone[:m]), (m, n)


@needs_kernels
@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("type_name", TYPES)
def test_argmax_is_the_index_of_the_largest_output(isa, type_name):
    # qlinear_argmax runs every format through the same (format, ISA) table as qlinear:
    # 1,100 outputs span two of its 1,024-output chunks, the last group short; n cuts
    # inside the first chunk, at its edge and past it
    k, n_out = 512, 1100
    raw = random_raw(type_name, n_out, k, 7)
    qs, d, m = pack_blocks(from_gguf(raw, type_name, n_out, k))
    fmt, i = FMT_CODES[GGUF_BLOCK_TYPES[type_name][0]], kernels.isa_index(isa)
    x = torch.randn(9, k, generator=torch.Generator().manual_seed(7))
    for dtype in (torch.float32, torch.bfloat16):
        y = ops.qlinear(x.to(dtype), qs, d, m, fmt, n_out, i)
        for n in (n_out, 1024, 1030, 17):
            got = ops.qlinear_argmax(x.to(dtype), qs, d, m, fmt, n, i)
            assert torch.equal(got, y[:, :n].max(dim=-1).indices), (dtype, n)


@pytest.mark.skipif("amx" not in ISAS, reason="no AMX (or no OS permission for it) here")
@pytest.mark.parametrize("type_name", TYPES)
def test_amx_panel_gives_the_vnni_outputs_bit_for_bit(type_name):
    # from 32 rows the 5-bit formats' panel runs its slabs of 16 rows on the tile unit
    # (csrc/quant/arch/amx/amx.h) and the rest on the VNNI tiles; Q4_K and Q6_K keep their tiles
    unit = _unit(type_name)
    for seed, (m, n, units) in enumerate([(32, 40, 2), (47, 37, 3), (64, 50, 1), (100, 17, 5)]):
        k = units * unit
        bw = from_gguf(random_raw(type_name, n, k, seed), type_name, n, k)
        for dtype in (torch.float32, torch.bfloat16):
            x = torch.randn(m, k, generator=torch.Generator().manual_seed(seed)).to(dtype)
            assert torch.equal(_qlinear(x, bw, "amx"), _qlinear(x, bw, "avx512")), (m, n, k)


@needs_kernels
@pytest.mark.parametrize("type_name", TYPES)
def test_stacked_weights_and_quant_linear(type_name):
    """q, k, v stacked (cat_rows) give the three outputs side by side; QuantLinear takes the
    form's fmt code on the best path."""
    k = 2 * _unit(type_name) if type_name.endswith("_K") else 96
    parts = [
        from_gguf(random_raw(type_name, n, k, s), type_name, n, k) for s, n in enumerate((24, 8, 8))
    ]
    x = torch.randn(3, k)
    isa = kernels.best_isa()
    joined = _qlinear(x, cat_rows(parts), isa)
    torch.testing.assert_close(joined, torch.cat([_qlinear(x, p, isa) for p in parts], dim=1))
    layer = QuantLinear(cat_rows(parts), None, torch.float32, isa)
    torch.testing.assert_close(layer(x), joined)
    assert layer.fmt == FMT_CODES[GGUF_BLOCK_TYPES[type_name][0]]


@needs_kernels
def test_qlinear_refuses_bad_k_quant_shapes():
    bw = from_gguf(random_raw("Q4_K", 20, 512, 0), "Q4_K", 20, 512)
    qs, d, m = pack_blocks(bw)
    with pytest.raises(RuntimeError, match="multiple of 256"):
        ops.qlinear(torch.randn(2, 480), qs, d, m, 3, 20, 0)
    with pytest.raises(RuntimeError, match="does not match"):
        ops.qlinear(torch.randn(2, 768), qs, d, m, 3, 20, 0)
    with pytest.raises(RuntimeError, match="needs m"):
        ops.qlinear(torch.randn(2, 512), qs, d, None, 3, 20, 0)
    with pytest.raises(RuntimeError, match="wrong shape"):
        ops.qlinear(torch.randn(2, 512), qs, d, m, 4, 20, 0)  # a Q4_K layout called Q5_K
    with pytest.raises(RuntimeError, match="unknown format"):
        ops.qlinear(torch.randn(2, 512), qs, d, m, 9, 20, 0)


@needs_kernels
def test_decode_layers_in_one_call_take_the_new_formats(tiny_model_dirs):
    """The one-call decode step (decode_layers) passes each linear's (fmt, n) to the same
    qlinear: with Q5_0 / Q5_1 linears (the tiny model's rows, 64 and 128, are too short
    for a K-quant) it must equal the module path bit for bit."""
    from common.config import CacheConfig, EngineConfig, ModelConfig
    from scheduler_worker.model_runner import ModelRunner

    src = tiny_model_dirs["llama"]
    config = EngineConfig(
        model=ModelConfig(model=str(src), dtype="float32", device="cpu", quantization="int4"),
        cache=CacheConfig(block_size=4, num_blocks=64),
    )
    runner = ModelRunner(config, src)
    model = runner.model
    swapped = 0
    for name, old in list(model.named_modules()):
        if not isinstance(old, QuantLinear) or not name.startswith("layers."):
            continue
        type_name = "Q5_0" if swapped % 2 == 0 else "Q5_1"
        n, k = old.out_features, old.in_features
        bw = from_gguf(random_raw(type_name, n, k, swapped), type_name, n, k)
        new = QuantLinear(bw, old.bias, torch.float32, old.isa)
        new.step_rows = old.step_rows
        parent, _, attr = name.rpartition(".")
        setattr(model.get_submodule(parent), attr, new)
        swapped += 1
    assert swapped == 8 and model.enable_decode_layers()
    fused, modules, _ = fused_and_module_decode(runner, model)
    assert torch.equal(fused, modules) and torch.isfinite(fused).all()
