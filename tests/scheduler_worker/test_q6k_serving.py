"""A GGUF file with Q6_K tensors (stacked alone, stacked with another type, and as the
output head) served by the Q6_K kernel on every kernel path: no tensor dequantized on the
fly, the file's Q6_K bytes and no more, the one-call decode step equal to the module path
bit for bit, and the logits close to the --quantization none float path's over the same
file (gguf-py cannot write Q6_K: `quantize_q6k` below does, gguf-py reads it back)."""

from __future__ import annotations

import logging

import gguf
import numpy as np
import pytest
import torch
from torch import nn

from scheduler_worker import kernels
from scheduler_worker.model_runner import SeqInput
from scheduler_worker.quant.dequant_linear import DequantLinear
from scheduler_worker.quant.gguf_weights import NO_KERNEL, GGUFBlocks
from scheduler_worker.quant.linear import QuantLinear
from scheduler_worker.quant.stacked import StackedLinear
from tests.conftest import tiny_config
from tests.gguf_files import write_llama_gguf
from tests.scheduler_worker.test_gguf_weights import PROMPTS, _engine, _last_logits
from tests.scheduler_worker.test_loader import _Records

ISAS = [
    i
    for i in kernels.ISAS
    if kernels.load() and kernels.isa_index(i) <= kernels.isa_index(kernels.best_isa())
]
Q6_K = gguf.GGMLQuantizationType.Q6_K


def quantize_q6k(a: np.ndarray) -> np.ndarray:
    """float [n, k] -> Q6_K rows [n, k / 256 * 210]: per 16 inputs an int8 scale of the
    float16 super-scale d, q - 32 = round(w / (d * scale)) in -32..31 (a plain absmax
    recipe, not llama.cpp's search: the tests read back what it wrote)."""
    n, k = a.shape
    nb = k // 256
    x = a.astype(np.float32).reshape(n, nb, 16, 16)
    piece = np.abs(x).max(-1) / 31.0  # [n, nb, 16]
    d = (piece.max(-1) / 127.0).astype(np.float16)
    d32 = d.astype(np.float32)[..., None]
    sc = np.clip(
        np.round(np.divide(piece, d32, out=np.zeros_like(piece), where=d32 > 0)), -128, 127
    )
    dw = (d32 * sc)[..., None]
    q = np.round(np.divide(x, dw, out=np.zeros_like(x), where=dw > 0))
    q = (np.clip(q, -32, 31) + 32).astype(np.uint8).reshape(n, nb, 2, 4, 32)  # [h, r, l]
    ql = np.concatenate(
        [
            q[:, :, :, 0] & 15 | (q[:, :, :, 2] & 15) << 4,
            q[:, :, :, 1] & 15 | (q[:, :, :, 3] & 15) << 4,
        ],
        axis=-1,
    )  # [n, nb, h, 64]: byte 64 h + l holds r = 0 | 2, 64 h + 32 + l holds r = 1 | 3
    qh = sum((q[:, :, :, r] >> 4) << (2 * r) for r in range(4)).astype(np.uint8)  # [n, nb, h, 32]
    blocks = np.concatenate(
        [
            ql.reshape(n, nb, 128),
            qh.reshape(n, nb, 64),
            sc.astype(np.int8).view(np.uint8),
            d.view(np.uint8).reshape(n, nb, 2),
        ],
        axis=-1,
    )
    return blocks.reshape(n, nb * 210)


def test_quantize_q6k_reads_back_through_gguf_py():
    a = np.random.default_rng(0).standard_normal((6, 512)).astype(np.float32) * 0.05
    w = gguf.quants.dequantize(quantize_q6k(a), Q6_K).reshape(a.shape)
    assert np.abs(w - a).max() <= np.abs(a).max() / 31  # half a step of the widest piece


def _types(name: str) -> gguf.GGMLQuantizationType:
    """q Q8_0 with k, v Q6_K (a mixed stack), o, gate/up Q6_K (a stack of one form), down
    Q6_K in layer 0 and Q4_1 in layer 1, the output head Q6_K."""
    kinds = {"attn_q": "Q8_0", "attn_k": "Q6_K", "attn_v": "Q6_K", "attn_output": "Q6_K"}
    kinds |= {"ffn_gate": "Q6_K", "ffn_up": "Q6_K"}
    parts = name.split(".")
    piece = parts[2] if name.startswith("blk.") else "output"
    if piece == "ffn_down":
        return gguf.GGMLQuantizationType["Q6_K" if parts[1] == "0" else "Q4_1"]
    return gguf.GGMLQuantizationType[kinds.get(piece, "Q6_K")]


@pytest.fixture(scope="module")
def q6k_gguf(tmp_path_factory):
    """A tiny Llama wide enough for 256-input super-blocks, written with `_types`."""
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    config = tiny_config(
        "LlamaConfig",
        vocab_size=49152,
        hidden_size=256,
        intermediate_size=512,
        max_position_embeddings=1024,
        initializer_range=0.05,
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config).eval()
    path = tmp_path_factory.mktemp("q6k") / "q6k.gguf"
    plain = gguf.quants.quantize

    def quantize(a: np.ndarray, qtype: gguf.GGMLQuantizationType) -> np.ndarray:
        return quantize_q6k(a) if qtype == Q6_K else plain(a, qtype)

    gguf.quants.quantize = quantize  # gguf-py has no Q6_K writer
    try:
        return write_llama_gguf(model, "llama", path, _types)
    finally:
        gguf.quants.quantize = plain


@pytest.fixture(scope="module")
def model_cache(tmp_path_factory):
    """One cache for the module: the file's conversion (config, tokenizer) is done once,
    not once per ISA; what differs by ISA is the engine built from it."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ZEROSERVE_CACHE_DIR", str(tmp_path_factory.mktemp("q6k_cache")))
        yield


@pytest.fixture(scope="module")
def float_logits(q6k_gguf, model_cache) -> list[torch.Tensor]:
    """The --quantization none float path's logits over the file after each of PROMPTS:
    the same for every ISA, so computed once."""
    float_engine = _engine(q6k_gguf, "none")
    return [_last_logits(float_engine, prompt).clone() for prompt in PROMPTS]


@pytest.mark.skipif(not kernels.load(), reason="the C++ kernels are not built here")
@pytest.mark.parametrize("isa", ISAS)
def test_q6k_tensors_served_by_the_kernel(q6k_gguf, isa, model_cache, float_logits):
    records = _Records()
    logging.getLogger("zeroserve.loader").addHandler(records)
    try:
        engine = _engine(q6k_gguf, "gguf", isa)
    finally:
        logging.getLogger("zeroserve.loader").removeHandler(records)
    lines = [line.removeprefix("weights: ") for line in records.lines]
    q6 = " (VNNI tiles: no AMX path for q6k)" if isa == "amx" else ""
    assert f"Q6_K x 12 -> qlinear q6k {isa}{q6}" in lines, (
        lines
    )  # 2 x (k, v, o, gate, up), down, output
    assert not [line for line in lines if NO_KERNEL in line], lines
    model = engine.runner.model
    assert not [m for m in model.modules() if isinstance(m, (DequantLinear, nn.Linear))]
    assert isinstance(model.lm_head, QuantLinear) and model.lm_head.form == "q6k"
    qkv = model.layers[0].self_attn.qkv_proj
    assert isinstance(qkv, StackedLinear) and [p.form for p in qkv.parts] == ["q8", "q6k", "q6k"]
    assert model.layers[0].mlp.gate_up_proj.form == "q6k"
    # the Q6_K tensors' memory is the file's bytes for them, exactly
    blocks = GGUFBlocks(q6k_gguf)
    file_bytes = sum(int(t.n_bytes) for t in blocks.tensors.values() if t.tensor_type == Q6_K)
    q6 = [m for m in model.modules() if isinstance(m, QuantLinear) and m.form == "q6k"]
    assert sum(m.qs.nbytes + m.d.nbytes for m in q6) == file_bytes
    assert all(m.m is None for m in q6)  # (a dense copy only where the plan keeps one)
    assert all((m.dense is None) == (engine.runner.weights.dense_dtype is None) for m in q6)

    # the one-call decode step takes the Q6_K parts, equal to the module path bit for bit
    runner = engine.runner
    plan = model.decode_plan
    assert plan is not None
    bs = runner.block_size
    lens = [5, 9, 1]
    tables = [list(range(1 + 4 * i, 5 + 4 * i)) for i in range(len(lens))]
    for i, n in enumerate(lens):
        runner.execute([SeqInput(list(range(10 + i, 10 + i + n)), 0, tables[i])])
    assert max(lens) < 4 * bs
    caches = [(k.clone(), v.clone()) for k, v in runner.kv_caches]
    seqs = [SeqInput([7 + i], n, tables[i]) for i, n in enumerate(lens)]
    meta = runner.prepare(seqs)[2]
    runner.step_rows.set_step(meta.num_decode)
    assert plan.takes(meta, len(seqs))
    fused = runner.execute(seqs)
    runner.kv_caches[:] = caches
    model.decode_plan = None
    modules = runner.execute(seqs)
    assert torch.isfinite(fused).all() and torch.equal(fused, modules)
    model.decode_plan = plan

    # against the float path over the same file (8-bit activations on the kernels: close)
    for prompt, want in zip(PROMPTS, float_logits, strict=True):
        got = _last_logits(engine, prompt)
        assert (got - want).norm() / want.norm() < 0.03
