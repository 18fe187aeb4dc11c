"""Weight-only int8/int4 linears: exact on Q4_1-shaped weights, packed kernels agree with the
dense dequantized weight, and a quantized engine equals transformers run on the same
dequantized weights (float32) or the unquantized engine (default model, bfloat16)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from common.config import CacheConfig, ConfigError, EngineConfig, ModelConfig
from scheduler_worker.quant import (
    INT4_GROUP_SIZE,
    WeightOnlyLinear,
    check_quantization,
    quantize_int4,
    quantize_int8,
    quantize_model,
)
from tests.conftest import hf_greedy

PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [3, 4, 100, 200, 300], [42], list(range(20, 60))]


def _linear(n: int, k: int, bias: bool, seed: int = 0) -> nn.Linear:
    torch.manual_seed(seed)
    lin = nn.Linear(k, n, bias=bias)
    with torch.no_grad():
        lin.weight.normal_(0, 0.05)
        if bias:
            lin.bias.normal_(0, 0.1)
    return lin


def test_int4_recovers_q4_1_weights_exactly():
    # Q4_1: each group of 32 is d * q + m with fp16 d, m and q in 0..15, using 0 and 15
    torch.manual_seed(0)
    n, k = 48, 128
    groups = k // INT4_GROUP_SIZE
    d = (torch.rand(n, groups) * 0.02 + 0.001).half().float()
    m = (torch.randn(n, groups) * 0.05).half().float()
    q = torch.randint(0, 16, (n, groups, INT4_GROUP_SIZE))
    q[..., 0], q[..., 1] = 0, 15
    w = (q * d[..., None] + m[..., None]).reshape(n, k)
    lin = nn.Linear(k, n, bias=False)
    lin.weight.data.copy_(w)
    ql = WeightOnlyLinear(lin, "int4", torch.float32)
    assert torch.equal(ql.weight, w)
    q2, scale, lo = quantize_int4(w)
    assert torch.equal(q2.reshape(n, groups, -1), q.to(torch.int32))
    assert torch.allclose(scale, d) and torch.equal(lo, m)


def test_int8_error_is_within_half_a_step():
    w = _linear(64, 96, False).weight.detach()
    q, scale = quantize_int8(w)
    assert q.dtype == torch.int8 and scale.shape == (64,)
    err = (q.float() * scale[:, None] - w).abs()
    assert (err <= scale[:, None] / 2 + 1e-7).all()


def test_int4_needs_whole_groups():
    with pytest.raises(ValueError, match="multiple of 32"):
        quantize_int4(torch.randn(8, 40))


@pytest.mark.parametrize("method", ["int8", "int4"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bias", [False, True])
def test_packed_kernel_equals_dense_dequantized(method, dtype, bias):
    lin = _linear(80, 128, bias)
    packed = WeightOnlyLinear(lin, method, dtype, max_rows=1 << 30)
    dense = WeightOnlyLinear(lin, method, dtype, max_rows=0)
    assert torch.equal(packed.weight, dense.weight)
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    for rows in (1, 3, 8):
        x = torch.randn(rows, 128).to(dtype)
        ref = F.linear(x.float(), dense.weight.float(), None if dense.bias is None else dense.bias.float())
        for layer in (packed, dense):
            y = layer(x)
            assert y.dtype == dtype and y.shape == (rows, 80)
            assert torch.allclose(y.float(), ref, atol=tol, rtol=tol), (rows, (y.float() - ref).abs().max())
    x3 = torch.randn(2, 3, 128).to(dtype)  # leading dims kept
    assert packed(x3).shape == (2, 3, 80)


def test_quantize_model_replaces_every_linear_and_keeps_lm_head_wider():
    model = nn.Module()
    model.proj = _linear(64, 64, True)
    model.inner = nn.Module()
    model.inner.mlp = _linear(128, 64, False)
    model.lm_head = _linear(256, 64, False)
    assert quantize_model(model, "int4", torch.float32) == 3
    assert isinstance(model.proj, WeightOnlyLinear) and model.proj.method == "int4"
    assert model.inner.mlp.method == "int4"
    assert model.lm_head.method == "int8"
    assert quantize_model(model, "none", torch.float32) == 0


def test_unsupported_combinations_are_refused():
    with pytest.raises(ConfigError, match="quantization must be one of"):
        ModelConfig(quantization="int3")
    for bad in ({"dtype": "float16"}, {"device": "cuda"}):
        with pytest.raises(ConfigError, match="runs on the CPU"):
            ModelConfig(quantization="int8", **bad)
    with pytest.raises(ValueError, match="CPU only"):
        check_quantization("int4", torch.device("cuda"), torch.bfloat16)
    with pytest.raises(ValueError, match="float16"):
        check_quantization("int8", torch.device("cpu"), torch.float16)
    check_quantization("none", torch.device("cuda"), torch.float16)


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
            if m == "int8":
                q, scale = quantize_int8(w)
                deq = q.float() * scale[:, None]
            else:
                q, scale, lo = quantize_int4(w)
                n = q.shape[0]
                deq = (q.float().reshape(n, -1, INT4_GROUP_SIZE) * scale[..., None]
                       + lo[..., None]).reshape(n, -1)  # fmt: skip
            # a new Parameter: unties lm_head from the embeddings, which stay unquantized
            mod.weight = nn.Parameter((deq.T if conv1d else deq).contiguous())
    model.config.tie_word_embeddings = False
    model.save_pretrained(dst)
    return dst


@pytest.mark.parametrize("kind", ["llama", "qwen2", "gpt2"])
@pytest.mark.parametrize("method", ["int8", "int4"])
def test_quantized_engine_equals_transformers_on_dequantized_weights(kind, method, tiny_model_dirs, tmp_path):
    from common.sampling_params import SamplingParams
    from scheduler_worker.engine import LLMEngine

    src = tiny_model_dirs[kind]
    expected = hf_greedy(_dequantized_hf_copy(src, tmp_path / "deq", method), PROMPTS, 16)
    config = EngineConfig(model=ModelConfig(model=str(src), dtype="float32", device="cpu",
                                            quantization=method),
                          cache=CacheConfig(block_size=4, num_blocks=256))  # fmt: skip
    engine = LLMEngine(config, src)
    got = engine.generate(PROMPTS, SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True))
    assert got == expected


def test_default_model_int4_bf16_keeps_greedy_text(default_model_dir):
    """One stream at a time runs the packed int4 kernels; the text equals bf16's unquantized."""
    from transformers import AutoTokenizer

    from common.sampling_params import SamplingParams
    from scheduler_worker.engine import LLMEngine

    tok = AutoTokenizer.from_pretrained(default_model_dir)
    prompt = tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                     add_generation_prompt=True)  # fmt: skip
    prompt = list(prompt if isinstance(prompt, list) else prompt["input_ids"])
    params = SamplingParams(max_tokens=16, temperature=0.0)
    outs = {}
    for quant in ("none", "int4"):
        engine = LLMEngine(EngineConfig(model=ModelConfig(dtype="bfloat16", device="cpu",
                                                          quantization=quant)),
                           default_model_dir)  # fmt: skip
        if quant == "int4":
            packed = [m for m in engine_modules(engine) if isinstance(m, WeightOnlyLinear)]
            assert len(packed) == 30 * 4 + 1 and all(m.max_rows >= 1 for m in packed)
        outs[quant] = engine.generate([prompt], params)[0]
    assert outs["int4"] == outs["none"]
    assert "Paris" in tok.decode(outs["int4"])


def engine_modules(engine):
    return list(engine.runner.model.modules())


def test_bench_quant_times_every_linear_shape(tiny_model_dirs, tmp_path, capsys):
    from benchmarks.bench_quant import main

    out = tmp_path / "q.json"
    res = main(["--model", str(tiny_model_dirs["llama"]), "--rows", "1,8", "--reps", "1",
                "--json", str(out)])  # fmt: skip
    # 2 layers x (qkv, o, gate_up, down) + lm_head; qkv/o/gate_up/down/lm_head shapes differ
    assert sum(res["shapes"].values()) == 9 and len(res["shapes"]) == 5
    assert list(res["ms_per_step"]) == [1, 8]
    for per in res["ms_per_step"].values():
        assert set(per) == {"dense", "int8", "int4"} and all(v > 0 for v in per.values())
    assert out.exists() and "ms per step in linears" in capsys.readouterr().out
