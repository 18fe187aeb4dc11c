"""The loader's modules over a GGUF file's own tensors: the dequantize-on-the-fly linear
and the embedding against gguf-py's dequantize, a file mixing types inside a stacked
projection against the float path, and the default model's weight memory and its
per-type kernel log."""

from __future__ import annotations

import logging
import re

import gguf
import numpy as np
import pytest
import torch
from torch import nn

from common.config import CacheConfig, EngineConfig, ModelConfig
from common.model_files.model_source import gguf_source
from scheduler_worker.engine import LLMEngine
from scheduler_worker.quant.dequant_linear import DequantLinear
from scheduler_worker.quant.embedding import QuantEmbedding
from scheduler_worker.quant.formats import GGUF_BLOCK_TYPES
from scheduler_worker.quant.gguf_weights import NO_KERNEL
from scheduler_worker.quant.linear import QuantLinear
from scheduler_worker.quant.stacked import StackedLinear
from tests.common.test_model_source import _tiny
from tests.gguf_files import write_llama_gguf
from tests.scheduler_worker.test_gguf_weights import PROMPTS, _engine, _last_logits

# the row-by-row path (DequantLinear) against gguf-py: types no kernel serves (Q2_K,
# Q3_K) and, as the path any type can take, kernel types
ROW_BY_ROW_TYPES = ["Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS", "Q5_0", "Q8_0"]


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def random_rows(type_name: str, n: int, k: int, seed: int = 0) -> np.ndarray:
    """n rows of k values in GGUF type `type_name`, random bytes below 0x3C: every float16
    field is then finite and below 1 in magnitude, every quant field arbitrary."""
    block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[type_name]]
    rng = np.random.default_rng(seed)
    return rng.integers(0, 0x3C, size=(n, k // block * size), dtype=np.uint8)


@pytest.mark.parametrize("type_name", ROW_BY_ROW_TYPES)
def test_dequant_linear_matches_gguf_dequantize(type_name):
    n, k = 37, 512
    raw = random_rows(type_name, n, k)
    qtype = gguf.GGMLQuantizationType[type_name]
    w = torch.from_numpy(gguf.quants.dequantize(raw, qtype).reshape(n, k)).double()
    torch.manual_seed(0)
    bias = torch.randn(n)
    lin = DequantLinear(raw, type_name, n, k, bias)
    lin.chunk_rows = 8  # several chunks and a tail of 5 rows
    assert lin.raw.numel() == raw.nbytes  # the file's bytes, no float copy
    for rows in (1, 3, 64):
        x = torch.randn(rows, k)
        want = x.double() @ w.T + bias.double()
        got = lin(x).double()  # float32 matmuls of the exact float32 weights
        assert float((got - want).norm() / want.norm()) < 1e-6
    x = torch.randn(2, 3, k, dtype=torch.bfloat16)  # bfloat16 activations, 3-D input
    assert lin(x).shape == (2, 3, n) and lin(x).dtype == torch.bfloat16


@pytest.mark.parametrize("type_name", ["Q8_0", "Q4_0", "Q4_1", "Q6_K", "F32"])
def test_quant_embedding_rows_equal_gguf_dequantize(type_name):
    vocab, dim = 50, 256
    if type_name == "F32":
        raw = np.random.default_rng(1).standard_normal((vocab, dim)).astype(np.float32)
        want = torch.from_numpy(raw.copy())
    else:
        raw = random_rows(type_name, vocab, dim, seed=1)
        qtype = gguf.GGMLQuantizationType[type_name]
        want = torch.from_numpy(gguf.quants.dequantize(raw, qtype).reshape(vocab, dim))
    emb = QuantEmbedding(raw, type_name, dim, torch.float32)
    ids = torch.tensor([[0, 49, 7], [7, 7, 3]])
    torch.testing.assert_close(emb(ids), want[ids], rtol=0, atol=0)
    assert emb.mapped_bytes() == raw.nbytes
    with pytest.raises(IndexError, match="out of range"):
        emb(torch.tensor([50]))


def _mixed(name: str) -> gguf.GGMLQuantizationType:
    """q/k/v in three types (two kernel forms and Q5_0, kernel-less until one is added),
    gate/up both Q5_0, down Q4_1, output Q8_0."""
    kinds = {"attn_q": "Q4_0", "attn_k": "Q8_0", "attn_v": "Q5_0", "ffn_gate": "Q5_0"}
    kinds |= {"ffn_up": "Q5_0", "ffn_down": "Q4_1", "attn_output": "Q4_1"}
    piece = name.split(".")[2] if name.startswith("blk.") else ""
    return gguf.GGMLQuantizationType[kinds.get(piece, "Q8_0")]


def test_mixed_types_in_a_stacked_projection_keep_no_float_copy(
    tmp_path,
    monkeypatch,
):
    monkeypatch.setenv("ZEROSERVE_CACHE_DIR", str(tmp_path / "cache"))
    path = write_llama_gguf(_tiny("llama3"), "llama", tmp_path / "mixed.gguf", _mixed)
    records = _Records()
    logging.getLogger("zeroserve.loader").addHandler(records)
    try:
        engine = _engine(path, "gguf")
    finally:
        logging.getLogger("zeroserve.loader").removeHandler(records)
    model = engine.runner.model
    assert not [m for m in model.modules() if type(m) in (nn.Linear, nn.Embedding)]
    assert isinstance(model.embed_tokens, QuantEmbedding)
    qkv = model.layers[0].self_attn.qkv_proj
    assert isinstance(qkv, StackedLinear) and qkv.source == "Q4_0+Q8_0+Q5_0"
    q5 = model.layers[0].mlp.gate_up_proj
    if "Q5_0" in GGUF_BLOCK_TYPES:  # a kernel helper added it: one QuantLinear
        assert isinstance(q5, QuantLinear)
    else:
        assert isinstance(q5, DequantLinear) and q5.source == "Q5_0"
        assert f"Q5_0 x 6 -> {NO_KERNEL}" in [
            line.removeprefix("weights: ") for line in records.lines
        ]
    assert any("layers.0.self_attn.qkv_proj (Q4_0+Q8_0+Q5_0)" in line for line in records.lines)
    kernel = engine.runner.use_kernels
    assert all(m.dense is None for m in model.modules() if isinstance(m, QuantLinear)) or not kernel
    every_part_on_a_kernel = isinstance(q5, QuantLinear) and all(
        isinstance(part, QuantLinear) for part in qkv.parts
    )
    if kernel and not every_part_on_a_kernel:  # a DequantLinear: the modules serve decodes
        assert getattr(model, "decode_plan", None) is None
    float_engine = _engine(path, "none")
    for prompt in PROMPTS:
        want = _last_logits(float_engine, prompt)
        got = _last_logits(engine, prompt)  # 8-bit activations on the kernels: close
        assert (got - want).norm() / want.norm() < 0.03


def test_default_model_weight_memory_within_the_file_and_logged(default_model_dir):
    records = _Records()
    logging.getLogger("zeroserve.loader").addHandler(records)
    try:
        engine = LLMEngine(
            EngineConfig(model=ModelConfig(device="cpu"), cache=CacheConfig(num_blocks=16)),
            default_model_dir,
        )
    finally:
        logging.getLogger("zeroserve.loader").removeHandler(records)
    mem = engine.runner.weight_memory
    source = gguf_source(default_model_dir)
    assert source is not None
    reader = gguf.GGUFReader(str(source))
    file_bytes = sum(int(t.n_bytes) for t in reader.tensors)
    assert mem.file_bytes == file_bytes
    assert mem.held_bytes <= 1.1 * file_bytes, mem.describe()
    assert mem.raw_bytes == 0 and mem.float_bytes < 0.05 * file_bytes  # norms, rope tables
    embd = next(t for t in reader.tensors if t.name == "token_embd.weight")
    assert mem.mapped_bytes == embd.n_bytes
    model = engine.runner.model
    assert not [m for m in model.modules() if type(m) in (nn.Linear, nn.Embedding)]
    path = engine.runner.weights.isa
    lines = [line.removeprefix("weights: ") for line in records.lines]
    if path is not None:
        # on AMX the 4-bit format keeps its VNNI tiles, and the log says so
        q4 = " (VNNI tiles: no AMX path for q4)" if path == "amx" else ""
        assert f"Q4_1 x 210 -> qlinear q4 {path}{q4}" in lines
        assert f"Q8_0 x 1 -> qlinear q8 {path}" in lines  # the tied output head
    assert "Q8_0 x 1 -> embedding rows dequantized on lookup" in lines
    assert any(f"the file's tensors: {file_bytes / 1e6:.1f} MB" in line for line in lines)


def test_device_cuda_without_a_usable_gpu_is_refused_by_the_scheduler(monkeypatch):
    """The scheduler's own check (launch.py's only sees a CPU build): one ConfigError line
    naming why, for a CPU build and for a CUDA build that finds no GPU."""
    from common.config import ConfigError
    from scheduler_worker.backends.device import resolve_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.version, "cuda", None)
    with pytest.raises(ConfigError, match=r"^--device cuda: this torch is a CPU build; "):
        resolve_device("cuda")
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    with pytest.raises(
        ConfigError,
        match=rf"^--device cuda: torch {re.escape(torch.__version__)} \(CUDA 12.8\) finds no usable GPU; ",
    ):
        resolve_device("cuda")
    assert resolve_device("auto") == torch.device("cpu")
    assert resolve_device("cpu") == torch.device("cpu")
