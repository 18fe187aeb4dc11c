"""IQ4_XS and IQ4_NL (GGUF's 4-bit codebook formats: quant/iq4xs.py, quant/iq4nl.py, their
rows in quant/formats.py and csrc/quant/formats.h) against gguf-py's dequantize and the
row-by-row path they replaced (DequantLinear): random blocks with tails in N, batches of 1
to 17 rows, every ISA path this machine has and the portable one; a path with no tiles of
its own for a format must run the next one down's (the portable kernel at the bottom), bit
for bit; and a tiny model whose every projection is IQ4_XS or IQ4_NL served from its
blocks."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from scheduler_worker import kernels
from scheduler_worker.quant.dequant_linear import DequantLinear
from scheduler_worker.quant.formats import (
    FMT_CODES,
    FORMATS,
    GGUF_BLOCK_TYPES,
    BlockWeight,
    dequantize,
    from_gguf,
    pack_blocks,
    quantize_activations,
    reference_qlinear,
)
from scheduler_worker.quant.groups import groups
from scheduler_worker.quant.linear import QuantLinear
from tests.conftest import tiny_config
from tests.gguf_files import write_llama_gguf
from tests.scheduler_worker.test_format_codes import kernel_table
from tests.scheduler_worker.test_gguf_weights import PROMPTS, _engine, _last_logits

ISAS = [
    i
    for i in kernels.ISAS
    if kernels.load() and kernels.isa_index(i) <= kernels.isa_index(kernels.best_isa())
]
needs_kernels = pytest.mark.skipif(not kernels.load(), reason="the C++ kernels are not built here")
TYPES = ["IQ4_XS", "IQ4_NL"]


def random_raw(type_name: str, n: int, k: int, seed: int) -> np.ndarray:
    """[n, row bytes] of random `type_name` bytes: random scales and nibbles, a float16 d
    (the first two bytes of a block) of either sign across two decades."""
    rng = np.random.default_rng(seed)
    form, size = GGUF_BLOCK_TYPES[type_name]
    units = k // FORMATS[form].unit
    blocks = rng.integers(0, 256, (n, units, size), dtype=np.uint8)
    d = rng.uniform(0.5, 1.0, (n, units, 1)) * 10.0 ** rng.uniform(-4, -2, (n, units, 1))
    blocks[..., 0:2] = (d * rng.choice([-1.0, 1.0], d.shape)).astype(np.float16).view(np.uint8)
    return blocks.reshape(n, -1)


def _qlinear(x: torch.Tensor, bw: BlockWeight, isa: str) -> torch.Tensor:
    return torch.ops.zeroserve.qlinear(
        x, *pack_blocks(bw), FMT_CODES[bw.form], bw.shape[0], kernels.isa_index(isa)
    )


@pytest.mark.parametrize("type_name", TYPES)
def test_from_gguf_keeps_every_value_and_packs_the_files_bytes(type_name):
    n, k = 37, 768
    raw = random_raw(type_name, n, k, 0)
    bw = from_gguf(raw, type_name, n, k)
    assert bw.form == GGUF_BLOCK_TYPES[type_name][0] and bw.shape == (n, k) and bw.m is None
    want = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[type_name]).reshape(n, k)
    assert torch.equal(dequantize(bw), torch.from_numpy(want))  # bit for bit
    qs, d, m = pack_blocks(bw)
    assert m is None and qs.numel() + 2 * d.numel() == bw.nbytes()
    # per row: the file's bytes (d and all) for IQ4_NL; IQ4_XS keeps 2 more per 256 inputs
    per_row = raw.shape[1] + (2 * k // 256 if type_name == "IQ4_XS" else 0)
    assert bw.nbytes() == groups(n) * 16 * per_row


def test_iq4_xs_refuses_a_row_not_a_multiple_of_256():
    with pytest.raises(ValueError, match="multiple of 256"):
        from_gguf(np.zeros((2, 136), np.uint8), "IQ4_XS", 2, 224)


@needs_kernels
@pytest.mark.parametrize("type_name", TYPES)
@pytest.mark.parametrize("isa", ISAS)
def test_qlinear_equals_the_gguf_oracle(isa, type_name):
    """gguf-py's dequantized weight times the kernels' 8-bit activations, in float64."""
    torch.manual_seed(0)
    shapes = [(16, 256), (37, 512), (50, 768)] + [(21, 96)] * (type_name == "IQ4_NL")
    for seed, (n, k) in enumerate(shapes):
        raw = random_raw(type_name, n, k, seed)
        bw = from_gguf(raw, type_name, n, k)
        qtype = gguf.GGMLQuantizationType[type_name]
        w = torch.from_numpy(gguf.quants.dequantize(raw, qtype).reshape(n, k)).double()
        for m in (1, 3, 8, 17):
            x = torch.randn(m, k)
            q, dx, _ = quantize_activations(x)
            ref = (q.double().reshape(m, -1, 32) * dx.double()[..., None]).reshape(m, k) @ w.T
            torch.testing.assert_close(reference_qlinear(x, bw), ref, rtol=1e-9, atol=1e-9)
            scale = ref.abs().max().item()
            y = _qlinear(x, bw, isa)
            torch.testing.assert_close(y.double(), ref, rtol=1e-5, atol=1e-5 * scale)
            yb = _qlinear(x.bfloat16(), bw, isa)
            assert yb.dtype == torch.bfloat16
            torch.testing.assert_close(yb.double(), ref, rtol=2e-2, atol=2e-2 * scale)


def _served_by(type_name: str, isa: str) -> str:
    """The path whose kernel runs `type_name` on `isa`: its own tiles, else the next ISA
    down's (qlinear.cpp's TILES), else the portable kernel."""
    row = kernel_table().get(GGUF_BLOCK_TYPES[type_name][0].upper(), ["nullptr"] * 3)
    for i in range(kernels.isa_index(isa), 0, -1):
        if row[i - 1] != "nullptr":
            return kernels.ISAS[i]
    return "scalar"


@needs_kernels
@pytest.mark.parametrize("type_name", TYPES)
def test_a_path_without_tiles_runs_the_one_below_bit_for_bit(type_name):
    n, k = 37, 512
    bw = from_gguf(random_raw(type_name, n, k, 4), type_name, n, k)
    torch.manual_seed(1)
    for m in (1, 5, 16):
        x = torch.randn(m, k)
        for isa in ISAS:
            want = _qlinear(x, bw, _served_by(type_name, isa))
            assert torch.equal(_qlinear(x, bw, isa), want), (isa, m)


@needs_kernels
@pytest.mark.parametrize("type_name", TYPES)
def test_quant_linear_replaces_the_row_by_row_path(type_name):
    n, k = 40, 512
    raw = random_raw(type_name, n, k, 5)
    bw = from_gguf(raw, type_name, n, k)
    rows = DequantLinear(raw, type_name, n, k)  # what served the type before its row
    torch.manual_seed(2)
    x = torch.randn(6, k)
    want = rows(x).double()
    kernel = QuantLinear(bw, None, torch.float32, kernels.best_isa())
    assert kernel.fmt == FMT_CODES[bw.form] and kernel.qs.numel() < raw.nbytes * 1.25
    got = kernel(x).double()  # 8-bit activations: close, not equal
    assert float((got - want).norm() / want.norm()) < 0.02
    dense = QuantLinear(bw, None, torch.float32, None)  # the pure-torch path: same weights
    torch.testing.assert_close(dense(x), rows(x), rtol=1e-6, atol=1e-6)


def _iq4_types(name: str) -> gguf.GGMLQuantizationType:
    """Attention IQ4_NL, the MLP IQ4_XS, the output head Q8_0 (llama-quantize keeps it
    wider too)."""
    kind = "Q8_0" if name == "output.weight" else "IQ4_NL" if ".attn_" in name else "IQ4_XS"
    return gguf.GGMLQuantizationType[kind]


def test_a_tiny_iq4_model_is_served_from_its_blocks(tmp_path, monkeypatch):
    from transformers import LlamaForCausalLM

    monkeypatch.setenv("ZEROSERVE_CACHE_DIR", str(tmp_path / "cache"))
    shape = dict(vocab_size=49152, max_position_embeddings=1024, bos_token_id=1, eos_token_id=2)
    config = tiny_config(
        "LlamaConfig",
        hidden_size=256,
        intermediate_size=512,
        tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        **shape,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval()
    path = write_llama_gguf(model, "llama", tmp_path / "iq4.gguf", _iq4_types)
    float_engine = _engine(path, "none")  # the same weights dequantized to float32
    engine = _engine(path, "gguf")
    quants = [m for m in engine.runner.model.modules() if isinstance(m, QuantLinear)]
    assert not [m for m in engine.runner.model.modules() if isinstance(m, DequantLinear)]
    assert {m.source for m in quants} == {"IQ4_NL", "IQ4_XS", "Q8_0"}
    assert sum(m.form == "iq4nl" for m in quants) == 2 * 2  # qkv, o per layer
    assert sum(m.form == "iq4xs" for m in quants) == 2 * 2  # gate_up, down per layer
    for prompt in PROMPTS:
        want = _last_logits(float_engine, prompt)
        got = _last_logits(engine, prompt)  # 8-bit activations on the kernels: close
        assert (got - want).norm() / want.norm() < 0.03
