"""IQ4_XS (GGUF's 4-bit codebook format: quant/iq4xs.py, its rows in quant/formats.py and
csrc/quant/formats.h) against gguf-py's dequantize and the row-by-row path it replaced
(DequantLinear): random blocks with tails in N, batches of 1 to 17 rows, every ISA path
this machine has and the portable one; a path with no IQ4_XS tiles of its own must run the
next one down's (the portable kernel at the bottom), bit for bit; and a tiny model whose
every projection is IQ4_XS served from its blocks."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from scheduler_worker import kernels
from scheduler_worker.quant.dequant_linear import DequantLinear
from scheduler_worker.quant.formats import (
    FMT_CODES,
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
IQ4_XS = gguf.GGMLQuantizationType.IQ4_XS


def random_raw(n: int, k: int, seed: int) -> np.ndarray:
    """[n, k / 256 * 136] random IQ4_XS bytes: random scales and nibbles, a float16 d of
    either sign across two decades."""
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, (n, k // 256, 136), dtype=np.uint8)
    d = rng.uniform(0.5, 1.0, (n, k // 256, 1)) * 10.0 ** rng.uniform(-4, -2, (n, k // 256, 1))
    blocks[..., 0:2] = (d * rng.choice([-1.0, 1.0], d.shape)).astype(np.float16).view(np.uint8)
    return blocks.reshape(n, -1)


def _qlinear(x: torch.Tensor, bw: BlockWeight, isa: str) -> torch.Tensor:
    return torch.ops.zeroserve.qlinear(
        x, *pack_blocks(bw), FMT_CODES["iq4xs"], bw.shape[0], kernels.isa_index(isa)
    )


def test_from_gguf_keeps_every_value_and_packs_the_files_bytes():
    n, k = 37, 768
    raw = random_raw(n, k, 0)
    bw = from_gguf(raw, "IQ4_XS", n, k)
    assert bw.form == "iq4xs" and bw.shape == (n, k) and bw.m is None
    want = gguf.quants.dequantize(raw, IQ4_XS).reshape(n, k)
    assert torch.equal(dequantize(bw), torch.from_numpy(want))  # bit for bit
    qs, d, m = pack_blocks(bw)
    assert m is None and qs.numel() + 2 * d.numel() == bw.nbytes()
    # per 16 rows and 256 inputs: the file's 136 bytes a row, + 2 for d kept per row
    assert bw.nbytes() == groups(n) * 16 * (k // 256) * 138
    with pytest.raises(ValueError, match="multiple of 256"):
        from_gguf(np.zeros((2, 136), np.uint8), "IQ4_XS", 2, 224)


@needs_kernels
@pytest.mark.parametrize("isa", ISAS)
def test_qlinear_equals_the_gguf_oracle(isa):
    """gguf-py's dequantized weight times the kernels' 8-bit activations, in float64."""
    torch.manual_seed(0)
    for seed, (n, k) in enumerate([(16, 256), (37, 512), (50, 768)]):
        raw = random_raw(n, k, seed)
        bw = from_gguf(raw, "IQ4_XS", n, k)
        w = torch.from_numpy(gguf.quants.dequantize(raw, IQ4_XS).reshape(n, k)).double()
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


def _served_by(isa: str) -> str:
    """The path whose kernel runs IQ4_XS on `isa`: its own tiles, else the next ISA down's
    (qlinear.cpp's TILES), else the portable kernel."""
    row = kernel_table().get("IQ4XS", ["nullptr"] * 3)
    for i in range(kernels.isa_index(isa), 0, -1):
        if row[i - 1] != "nullptr":
            return kernels.ISAS[i]
    return "scalar"


@needs_kernels
def test_a_path_without_iq4_xs_tiles_runs_the_one_below_bit_for_bit():
    n, k = 37, 512
    bw = from_gguf(random_raw(n, k, 4), "IQ4_XS", n, k)
    torch.manual_seed(1)
    for m in (1, 5, 16):
        x = torch.randn(m, k)
        for isa in ISAS:
            assert torch.equal(_qlinear(x, bw, isa), _qlinear(x, bw, _served_by(isa))), (isa, m)


@needs_kernels
def test_quant_linear_replaces_the_row_by_row_path():
    n, k = 40, 512
    raw = random_raw(n, k, 5)
    bw = from_gguf(raw, "IQ4_XS", n, k)
    rows = DequantLinear(raw, "IQ4_XS", n, k)  # what served IQ4_XS before its row
    torch.manual_seed(2)
    x = torch.randn(6, k)
    want = rows(x).double()
    kernel = QuantLinear(bw, None, torch.float32, kernels.best_isa())
    assert kernel.fmt == FMT_CODES["iq4xs"] and kernel.qs.numel() < raw.nbytes * 1.25
    got = kernel(x).double()  # 8-bit activations: close, not equal
    assert float((got - want).norm() / want.norm()) < 0.02
    dense = QuantLinear(bw, None, torch.float32, None)  # the pure-torch path: same weights
    torch.testing.assert_close(dense(x), rows(x), rtol=1e-6, atol=1e-6)


def _iq4_xs_but_the_output(name: str) -> gguf.GGMLQuantizationType:
    """Every projection IQ4_XS, the output head Q8_0 (llama-quantize keeps it wider too)."""
    return gguf.GGMLQuantizationType.Q8_0 if name == "output.weight" else IQ4_XS


def test_a_tiny_iq4_xs_model_is_served_from_its_blocks(tmp_path, monkeypatch):
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
    path = write_llama_gguf(model, "llama", tmp_path / "iq4xs.gguf", _iq4_xs_but_the_output)
    float_engine = _engine(path, "none")  # the same weights dequantized to float32
    engine = _engine(path, "gguf")
    quants = [m for m in engine.runner.model.modules() if isinstance(m, QuantLinear)]
    assert not [m for m in engine.runner.model.modules() if isinstance(m, DequantLinear)]
    assert {m.source for m in quants} == {"IQ4_XS", "Q8_0"}
    assert sum(m.form == "iq4xs" for m in quants) == 2 * 4  # qkv, o, gate_up, down per layer
    for prompt in PROMPTS:
        want = _last_logits(float_engine, prompt)
        got = _last_logits(engine, prompt)  # 8-bit activations on the kernels: close
        assert (got - want).norm() / want.norm() < 0.03
