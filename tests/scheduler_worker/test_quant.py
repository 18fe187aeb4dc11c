"""Block-quantized weights: GGUF blocks unpacked without changing a value, float weights
quantized by Q4_1's / Q8_0's recipes, QuantLinear on every path (C++ kernels, dense copy,
pure torch), and quantized engines against transformers on the same dequantized weights."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from common.config import CacheConfig, ConfigError, EngineConfig, ModelConfig
from scheduler_worker import kernels
from scheduler_worker.quant.formats import (
    QK,
    dequantize,
    from_gguf,
    pack_blocks,
    quantize_q4,
    quantize_q8,
    reference_qlinear,
)
from scheduler_worker.quant.linear import QuantLinear, quantize_model
from tests.conftest import hf_greedy, kernels_built

PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [3, 4, 100, 200, 300], [42], list(range(20, 60))]
BEST = kernels.best_isa() if kernels_built() else None


def _linear(n: int, k: int, bias: bool, seed: int = 0) -> nn.Linear:
    torch.manual_seed(seed)
    lin = nn.Linear(k, n, bias=bias)
    with torch.no_grad():
        lin.weight.normal_(0, 0.05)
        if bias:
            lin.bias.normal_(0, 0.1)
    return lin


@pytest.mark.parametrize("type_name", ["Q4_0", "Q4_1", "Q8_0"])
def test_gguf_blocks_keep_every_value(type_name):
    rng = np.random.default_rng(0)
    n, k = 24, 96
    w = rng.normal(0, 0.05, (n, k)).astype(np.float32)
    qtype = gguf.GGMLQuantizationType[type_name]
    raw = gguf.quants.quantize(w, qtype)
    bw = from_gguf(raw, type_name, n, k)
    assert bw.shape == (n, k) and bw.form == ("q8" if type_name == "Q8_0" else "q4")
    expected = gguf.quants.dequantize(raw, qtype).reshape(n, k)
    assert torch.equal(dequantize(bw), torch.from_numpy(expected))  # bit for bit
    # the kernels' layout: 32 rows (24 padded to 2 groups of 16), per block nibbles/int8
    # plus float16 scale (and min)
    assert bw.nbytes() == 32 * k // QK * (20 if bw.form == "q4" else 34)
    assert bw.nbytes() == sum(
        t.numel() * t.element_size() for t in pack_blocks(bw) if t is not None
    )


def test_unsupported_gguf_type_is_refused():
    # Q2_K has no kernel (the loader serves it dequantized on the fly): no BlockWeight
    with pytest.raises(ValueError, match="no kernel"):
        from_gguf(np.zeros((2, 84), np.uint8), "Q2_K", 2, 256)


def test_q4_recovers_q4_1_shaped_weights_exactly():
    # Q4_1: each block of 32 is d * q + m with q in 0..15, using both 0 and 15
    torch.manual_seed(0)
    n, k = 48, 128
    d = (torch.rand(n, k // QK) * 0.02 + 0.001).half().float()
    m = (torch.randn(n, k // QK) * 0.05).half().float()
    q = torch.randint(0, 16, (n, k // QK, QK))
    q[..., 0], q[..., 1] = 0, 15
    w = (q * d[..., None] + m[..., None]).reshape(n, k)
    bw = quantize_q4(w)
    torch.testing.assert_close(dequantize(bw), w, rtol=0, atol=1e-6)


def test_q8_error_is_within_half_a_step_and_blocks_must_be_whole():
    w = _linear(64, 96, False).weight.detach()
    bw = quantize_q8(w)
    assert torch.equal(bw.d.half().float(), bw.d)  # scales are float16 values, as in GGUF
    err = (dequantize(bw) - w).abs().reshape(64, -1, QK)
    # half a step, plus the float16 rounding of d (relative 2^-11) times |q| <= 127
    d = bw.d[..., None]
    assert (err <= d / 2 + 127 * d * 2**-11 + 1e-7).all()
    assert (err <= d / 2 + 1e-7).float().mean() > 0.9  # the rounding of d rarely matters
    with pytest.raises(ValueError, match="multiple of 32"):
        quantize_q4(torch.randn(8, 40))


@pytest.mark.skipif(BEST is None, reason="the C++ kernels are not built here")
@pytest.mark.parametrize("form", ["q4", "q8"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bias", [False, True])
def test_quant_linear_kernel_dense_copy_and_pure_torch_agree(form, dtype, bias):
    lin = _linear(80, 128, bias)
    bw = quantize_q4(lin.weight) if form == "q4" else quantize_q8(lin.weight)
    kernel = QuantLinear(bw, lin.bias, dtype, BEST, dense_dtype=torch.bfloat16, dense_above=4)
    pure = QuantLinear(bw, lin.bias, dtype, None)
    assert pure.dense is not None and torch.equal(
        pure.dense.float(), dequantize(bw).to(dtype).float()
    )
    b = torch.zeros(80) if lin.bias is None else lin.bias.detach()
    for rows in (1, 3, 4, 5, 16):  # up to 4 rows: the kernel; above: the dense bf16 copy
        x = torch.randn(rows, 128).to(dtype)
        y = kernel(x)
        assert y.dtype == dtype and y.shape == (rows, 80)
        if rows <= 4:  # the kernel's own arithmetic (8-bit activations), float64 oracle
            ref = reference_qlinear(x.float(), bw) + b.double()
            tol = 1e-4 if dtype == torch.float32 else 2e-2
        else:
            ref = F.linear(x.bfloat16(), dequantize(bw).bfloat16()).double() + b.double()
            tol = 2e-2
        torch.testing.assert_close(y.double(), ref, rtol=tol, atol=tol)
        dense = F.linear(x.float(), dequantize(bw), b)
        torch.testing.assert_close(
            pure(x).float(),
            dense,
            rtol=3e-2 if dtype != torch.float32 else 1e-5,
            atol=3e-2 if dtype != torch.float32 else 1e-5,
        )
        assert (y.float() - dense).abs().max() < 0.05 * dense.abs().max()  # 8-bit activations
    assert kernel(torch.randn(2, 3, 128).to(dtype)).shape == (2, 3, 80)  # leading dims kept


@pytest.mark.skipif(BEST is None, reason="the C++ kernels are not built here")
def test_step_rows_send_decode_rows_to_the_kernels_and_prompt_rows_to_the_dense_copy():
    from scheduler_worker.quant.linear import DENSE_ABOVE_ROWS, StepRows

    lin = _linear(40, 64, True)
    bw = quantize_q4(lin.weight)
    layer = QuantLinear(bw, lin.bias, torch.float32, BEST, dense_dtype=torch.bfloat16)
    layer.step_rows = StepRows()
    x = torch.randn(12, 64)
    kernel_only = QuantLinear(bw, lin.bias, torch.float32, BEST)(x)  # no dense copy
    dense_only = F.linear(x.bfloat16(), dequantize(bw).bfloat16()).float() + lin.bias.detach()
    layer.step_rows.set_step(3)  # 3 decode rows first, then 9 prompt rows
    y = layer(x)
    torch.testing.assert_close(y[:3], kernel_only[:3], rtol=0, atol=0)  # row for row the same
    torch.testing.assert_close(y[3:], dense_only[3:], rtol=1e-6, atol=1e-6)
    layer.step_rows.set_step(DENSE_ABOVE_ROWS + 1)  # a large decode batch: all dense
    torch.testing.assert_close(layer(x), dense_only, rtol=1e-6, atol=1e-6)


def test_quantize_model_replaces_every_linear_and_keeps_lm_head_wider():
    model = nn.Module()
    model.proj = _linear(64, 64, True)
    model.inner = nn.Module()
    model.inner.mlp = _linear(128, 64, False)
    model.lm_head = _linear(256, 64, False)
    assert quantize_model(model, "int4", torch.float32, BEST) == 3
    assert isinstance(model.proj, QuantLinear) and model.proj.form == "q4"
    assert model.inner.mlp.form == "q4" and model.lm_head.form == "q8"
    assert model.proj.bias is not None


def test_unsupported_combinations_are_refused():
    with pytest.raises(ConfigError, match="quantization must be one of"):
        ModelConfig(quantization="int3")
    with pytest.raises(ConfigError, match="kernels must be one of"):
        ModelConfig(kernels="avx9")
    for bad in ({"dtype": "float16"}, {"device": "cuda"}):
        with pytest.raises(ConfigError, match="runs on the CPU"):
            ModelConfig(quantization="int8", **bad)
    ModelConfig(quantization="auto", dtype="float16")  # auto resolves to none there


def test_kernels_naming_a_path_the_cpu_lacks_is_refused(monkeypatch):
    from common import cpu

    monkeypatch.setattr(cpu, "cpu_flags", lambda: frozenset({"avx2", "fma", "f16c"}))
    assert cpu.best_kernel_isa() == "avx2"
    cpu.check_kernel_choice("avx2")
    cpu.check_kernel_choice("auto")
    with pytest.raises(ConfigError, match="--kernels avx512: this CPU's best kernel path is avx2"):
        cpu.check_kernel_choice("avx512")


def test_gguf_quantization_needs_a_gguf_model(tiny_model_dirs):
    from scheduler_worker.engine import LLMEngine

    with pytest.raises(ValueError, match="needs a GGUF model"):
        LLMEngine(
            EngineConfig(
                model=ModelConfig(
                    model=str(tiny_model_dirs["llama"]), device="cpu", quantization="gguf"
                )
            )
        )


def _dequantized_hf_copy(src, dst, method: str):
    """The tiny HF checkpoint with every projection replaced by its quantize-dequantize."""
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32).eval()
    with torch.no_grad():
        for name, mod in list(model.named_modules()):
            conv1d = type(mod).__name__ == "Conv1D"  # GPT-2 stores [in, out]
            if not (isinstance(mod, nn.Linear) or conv1d):
                continue
            w = mod.weight.T if conv1d else mod.weight
            m = "int8" if method == "int4" and name.endswith("lm_head") else method
            deq = dequantize(quantize_q8(w) if m == "int8" else quantize_q4(w))
            # a new Parameter: unties lm_head from the embeddings, which stay unquantized
            mod.weight = nn.Parameter((deq.T if conv1d else deq).contiguous())
    model.config.tie_word_embeddings = False
    model.save_pretrained(dst)
    return dst


@pytest.mark.parametrize("kind", ["llama", "qwen2", "gpt2"])
@pytest.mark.parametrize("method", ["int8", "int4"])
def test_pure_torch_quantized_engine_equals_transformers_on_dequantized_weights(
    kind, method, tiny_model_dirs, tmp_path
):
    """--kernels torch: the oracle path multiplies by the dequantized weights exactly."""
    from common.sampling_params import SamplingParams
    from scheduler_worker.engine import LLMEngine

    src = tiny_model_dirs[kind]
    expected = hf_greedy(_dequantized_hf_copy(src, tmp_path / "deq", method), PROMPTS, 16)
    config = EngineConfig(
        model=ModelConfig(
            model=str(src), dtype="float32", device="cpu", quantization=method, kernels="torch"
        ),
        cache=CacheConfig(block_size=4, num_blocks=256),
    )
    engine = LLMEngine(config, src)
    got = engine.generate(PROMPTS, SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True))
    assert got == expected


def test_bench_quant_times_every_linear_shape(tiny_model_dirs, tmp_path, capsys):
    if BEST is None:
        pytest.skip("the C++ kernels are not built here")
    from benchmarks.bench_quant import main

    out = tmp_path / "q.json"
    res = main(
        [
            "--model",
            str(tiny_model_dirs["llama"]),
            "--rows",
            "1,8",
            "--reps",
            "1",
            "--json",
            str(out),
        ]
    )
    # 2 layers x (qkv, o, gate_up, down) + lm_head; qkv/o/gate_up/down/lm_head shapes differ
    assert sum(res["shapes"].values()) == 9 and len(res["shapes"]) == 5
    assert list(res["ms_per_step"]) == [1, 8]
    for per in res["ms_per_step"].values():
        assert {"dense/float32", "dense/bfloat16", f"q4/{BEST}"} <= set(per)
        assert all(v > 0 for v in per.values())
    assert out.exists() and "ms per step in linears" in capsys.readouterr().out


@pytest.mark.skipif(BEST is None, reason="the C++ kernels are not built here")
@pytest.mark.parametrize("kind", ["llama", "qwen2"])  # qwen2: q/k/v biases
@pytest.mark.parametrize(
    "method,dtype", [("int4", "float32"), ("int8", "float32"), ("int4", "bfloat16")]
)
def test_decode_layers_in_one_call_equal_the_modules_bit_for_bit(
    kind, method, dtype, tiny_model_dirs
):
    """A decode step on the integer kernels runs every decoder layer in one C++ call
    (torch.ops.zeroserve.decode_layers); it must give exactly the module path's logits and
    KV cache, for a batch of sequences at different context lengths."""
    from scheduler_worker.model_runner import ModelRunner, SeqInput

    src = tiny_model_dirs[kind]
    config = EngineConfig(
        model=ModelConfig(model=str(src), dtype=dtype, device="cpu", quantization=method),
        cache=CacheConfig(block_size=4, num_blocks=64),
    )
    runner = ModelRunner(config, src)
    plan = runner.model.decode_plan
    assert plan is not None, "every decoder linear is on the kernels: the one-call plan is made"
    lens = [5, 9, 1]
    tables = [list(range(1 + 4 * i, 5 + 4 * i)) for i in range(len(lens))]
    for i, n in enumerate(lens):  # the prompts, through the modules (prompt rows)
        runner.execute([SeqInput(list(range(10 + i, 10 + i + n)), 0, tables[i])])
    caches = [(k.clone(), v.clone()) for k, v in runner.kv_caches]
    seqs = [SeqInput([7 + i], n, tables[i]) for i, n in enumerate(lens)]
    meta = runner.prepare(seqs)[2]
    runner.step_rows.set_step(meta.num_decode)  # as execute() does
    assert plan.takes(meta, len(seqs))
    fused = runner.execute(seqs)
    fused_caches = [(k.clone(), v.clone()) for k, v in runner.kv_caches]
    runner.kv_caches[:] = caches
    runner.model.decode_plan = None
    modules = runner.execute(seqs)
    assert torch.equal(fused, modules)
    for (k1, v1), (k2, v2) in zip(fused_caches, runner.kv_caches):
        assert torch.equal(k1, k2) and torch.equal(v1, v2)
    # a step with prompt rows takes the modules even with the plan in place
    runner.model.decode_plan = plan
    meta = runner.prepare([SeqInput([1, 2], 0, [60])])[2]
    runner.step_rows.set_step(meta.num_decode)
    assert not plan.takes(meta, 2)


def test_no_one_call_plan_without_the_kernels(tiny_model_dirs):
    from scheduler_worker.model_runner import ModelRunner

    src = tiny_model_dirs["llama"]
    config = EngineConfig(
        model=ModelConfig(
            model=str(src), dtype="float32", device="cpu", quantization="int4", kernels="torch"
        ),
        cache=CacheConfig(block_size=4, num_blocks=16),
    )
    assert ModelRunner(config, src).model.decode_plan is None


@pytest.mark.skipif(not kernels_built(), reason="C++ kernels not built")
def test_no_one_call_plan_where_decode_attention_is_a_torch_path(tiny_model_dirs, monkeypatch):
    """The one-call op attends with the paged kernel: under a torch decode attention
    (ZEROSERVE_DECODE_ATTENTION=sdpa) the op set offers no one-call decode, no plan is made
    and a decode step runs through the modules, to the paged runner's logits."""
    from scheduler_worker.model_runner import ModelRunner, SeqInput

    src = tiny_model_dirs["llama"]
    config = EngineConfig(
        model=ModelConfig(model=str(src), dtype="float32", device="cpu", quantization="int8"),
        cache=CacheConfig(block_size=4, num_blocks=16, kv_cache_dtype="float32"),
    )
    paged = ModelRunner(config, src)
    assert paged.backend.ops.one_call_decode and paged.model.decode_plan is not None
    monkeypatch.setenv("ZEROSERVE_DECODE_ATTENTION", "sdpa")
    runner = ModelRunner(config, src)
    assert runner.decode_kernel == "sdpa" and runner.kernel_isa is not None
    assert not runner.backend.ops.one_call_decode and runner.model.decode_plan is None
    out = []
    for r in (runner, paged):
        r.execute([SeqInput([5, 6, 7], 0, [1])])
        out.append(r.execute([SeqInput([8], 3, [1])]))
    torch.testing.assert_close(out[0], out[1], rtol=1e-4, atol=1e-4)
