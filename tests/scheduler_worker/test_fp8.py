"""FP8 (E4M3) linears on the CPU: the quantization, the float32 emulation of the scaled
matmul against float64, the CUDA path's call of torch._scaled_mm against its contract (a
stand-in checks the dtypes, shapes and layouts torch 2.11 asks for row-wise scaling and
computes the emulation), the Triton per-token kernel under the interpreter, and the
refusals (a GPU older than sm_89, float16)."""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from common.config import ConfigError, ModelConfig
from scheduler_worker.backends.device import fp8_capability_problem
from scheduler_worker.quant import fp8
from scheduler_worker.quant.fp8 import (
    FP8,
    FP8_MAX,
    Fp8Linear,
    dequantize,
    emulated_scaled_mm,
    quantize_model_fp8,
    quantize_rows,
)
from scheduler_worker.quant.plan import plan_weights


def test_quantize_rows_scales_each_row_to_the_e4m3_range():
    torch.manual_seed(0)
    w = torch.randn(64, 256) * torch.logspace(-3, 2, 64).unsqueeze(1)  # rows far apart
    q, s = quantize_rows(w)
    assert q.dtype == FP8 and s.dtype == torch.float32 and s.shape == (64, 1)
    assert torch.equal(q.float().abs().amax(dim=1), torch.full((64,), FP8_MAX))
    back = dequantize(q, s, torch.float32)
    # E4M3 keeps 3 mantissa bits: a normal value is within half an ulp, 2^-4 relative;
    # below 2^-6 of the scale (subnormals) the step is the scale times 2^-9
    err = (back - w).abs()
    bound = torch.maximum(w.abs() * 2**-4, s * 2**-10)
    assert bool((err <= bound * 1.0001).all())
    zero_q, zero_s = quantize_rows(torch.zeros(2, 16))  # an all-zero row: finite, exact
    assert torch.equal(dequantize(zero_q, zero_s, torch.float32), torch.zeros(2, 16))


def test_emulated_scaled_mm_is_the_exact_products_summed():
    torch.manual_seed(1)
    x, w = torch.randn(5, 96), torch.randn(48, 96)
    (qx, sx), (qw, sw) = quantize_rows(x), quantize_rows(w)
    got = emulated_scaled_mm(qx, sx, qw, sw)
    want = (qx.double() * sx.double()) @ (qw.double() * sw.double()).t()
    assert got.dtype == torch.float32
    assert float((got.double() - want).abs().max()) < 1e-5 * float(want.abs().max())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fp8_linear_per_channel_is_w8a8(dtype):
    torch.manual_seed(2)
    lin = nn.Linear(128, 80, bias=True)
    f = Fp8Linear.quantize(lin)
    assert f.weight.dtype == FP8 and f.per_channel
    x = torch.randn(3, 7, 128).to(dtype)
    with torch.no_grad():
        y = f(x)
    assert y.shape == (3, 7, 80) and y.dtype == dtype
    qx, sx = quantize_rows(x.reshape(-1, 128))
    want = emulated_scaled_mm(qx, sx, f.weight, f.weight_scale) + lin.bias.float()
    assert torch.equal(y.reshape(-1, 80), want.to(dtype))
    with torch.no_grad():
        rel = float((y.float() - lin(x.float())).norm() / lin(x.float()).norm())
    assert 0 < rel < 0.05  # FP8 moves the product by a few percent at most


def test_fp8_linear_block_scales_are_weight_only():
    torch.manual_seed(3)
    q, _ = quantize_rows(torch.randn(80, 300))
    scale = torch.rand(80, 3) + 0.5  # 3 column groups of 128 (the last one short)
    f = Fp8Linear(q, scale, None, group_size=128)
    assert not f.per_channel
    x = torch.randn(4, 300)
    w = q.float() * torch.cat([scale[:, g : g + 1].expand(80, 128) for g in range(3)], 1)[:, :300]
    assert torch.allclose(f(x), F.linear(x, w), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="do not cover"):
        Fp8Linear(q, scale, None, group_size=64)  # 5 groups of 64, not 3


def test_quantize_model_swaps_every_linear_but_those_kept():
    emb = nn.Embedding(32, 16)
    model = nn.ModuleDict({"embed": emb, "proj": nn.Linear(16, 16), "lm_head": nn.Linear(16, 32)})
    model["lm_head"].weight = emb.weight  # tied
    assert quantize_model_fp8(model) == 2
    assert isinstance(model["lm_head"], Fp8Linear) and model["embed"] is emb
    assert emb.weight.dtype == torch.float32  # the embedding itself is untouched
    kept = nn.ModuleDict({"lm_head": nn.Linear(4, 4), "o_proj": nn.Linear(4, 4)})
    assert quantize_model_fp8(kept, fp8.FP8_KEEP) == 1  # the loader's: the head stays float
    assert isinstance(kept["lm_head"], nn.Linear) and isinstance(kept["o_proj"], Fp8Linear)


def test_quantize_model_keeps_the_last_decoder_layers_in_float():
    def block() -> nn.ModuleDict:
        return nn.ModuleDict({"o_proj": nn.Linear(4, 4), "down_proj": nn.Linear(4, 4)})

    model = nn.ModuleDict(
        {"layers": nn.ModuleList([block() for _ in range(12)]), "lm_head": nn.Linear(4, 8)}
    )
    assert quantize_model_fp8(model, fp8.FP8_KEEP, keep_last_layers=1) == 11 * 2
    for i, layer in enumerate(model["layers"]):
        for m in layer.values():  # layer 11 (not layer 1: "layers.1." is no prefix of it)
            assert isinstance(m, Fp8Linear) == (i < 11), i
    assert type(model["lm_head"]) is nn.Linear


def test_cuda_path_calls_scaled_mm_as_its_contract_asks(monkeypatch):
    """The GPU branch on the CPU: torch._scaled_mm replaced by a stand-in that checks what
    torch 2.11's row-wise scaling needs (E4M3 operands, mat2 column-major, float32 scales
    [M, 1] and [1, N], bfloat16 out) and returns the emulation."""
    calls = []

    def fake_scaled_mm(a, b, scale_a, scale_b, bias=None, out_dtype=None):
        assert a.dtype == FP8 and b.dtype == FP8 and a.is_contiguous()
        assert b.stride(0) == 1 and b.stride(1) == b.shape[0]  # column-major [K, N]
        assert scale_a.dtype == scale_b.dtype == torch.float32
        assert scale_a.shape == (a.shape[0], 1) and scale_b.shape == (1, b.shape[1])
        assert out_dtype == torch.bfloat16 and (bias is None or bias.dtype == torch.bfloat16)
        calls.append(a.shape)
        y = (a.float() @ b.float()) * scale_a * scale_b
        return (y if bias is None else y + bias.float()).to(out_dtype)

    monkeypatch.setattr(torch, "_scaled_mm", fake_scaled_mm)
    import scheduler_worker.backends.triton_fp8 as tf

    monkeypatch.setattr(tf, "quantize_tokens", quantize_rows)  # the kernel: tested below
    torch.manual_seed(4)
    lin = nn.Linear(64, 32).to(torch.bfloat16)
    f = Fp8Linear.quantize(lin)
    x = torch.randn(6, 64, dtype=torch.bfloat16)
    y = tf.scaled_mm(x, f.weight, f.weight_scale, f.bias)
    assert calls == [(6, 64)] and y.dtype == torch.bfloat16
    assert torch.allclose(y.float(), f(x).float(), rtol=1e-2, atol=1e-2)  # the CPU's maths
    y16 = tf.scaled_mm(x.half(), f.weight, f.weight_scale, None)
    assert y16.dtype == torch.float16
    # the module takes it through the GPU's op set where _scaled_mm takes the shape
    from scheduler_worker.backends.triton_ops import TritonOps

    f.ops = TritonOps()
    assert torch.equal(f(x), y) and calls == [(6, 64)] * 3
    odd = Fp8Linear.quantize(nn.Linear(60, 32).to(torch.bfloat16))  # K not a multiple of 16
    odd.ops = f.ops
    assert odd(x[:, :60]).shape == (6, 32) and len(calls) == 3  # emulated


def test_triton_per_token_kernel_equals_quantize_rows(monkeypatch):
    pytest.importorskip("triton")
    if not torch.cuda.is_available():
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    import importlib

    import scheduler_worker.backends.triton_fp8 as tf

    if os.environ.get("TRITON_INTERPRET") == "1":
        tf = importlib.reload(tf)  # decorated under the interpreter
    interpreted = os.environ.get("TRITON_INTERPRET") == "1"
    dev = "cpu" if interpreted else "cuda"
    assert (tf.FP8, tf.FP8_MAX) == (FP8, FP8_MAX)  # its own copy of the format's constants
    torch.manual_seed(5)
    for dtype, k in ((torch.bfloat16, 3000), (torch.float32, 64), (torch.float16, 1024)):
        x = (torch.randn(5, k) * torch.logspace(-2, 2, 5).unsqueeze(1)).to(dtype).to(dev)
        q, s = tf.quantize_tokens(x)
        q_ref, s_ref = quantize_rows(x)
        assert torch.allclose(s, s_ref, rtol=1e-6, atol=0)
        got, want = q.float(), q_ref.float()
        if interpreted:
            # Triton's interpreter (3.7) converts float32 to E4M3 with its own rounding: the
            # carry into the next power of two lost (124.6 -> 64, not 128), ties away from
            # even (84 -> 88), subnormals off by a step. Compiled, the GPU's conversion
            # rounds to nearest even: there, every value must be equal.
            off = got != want
            assert int(off.sum()) < 0.03 * got.numel()
            ratio = got[off] / want[off]
            assert bool(((ratio >= 0.5) & (ratio <= 2)).all())
        else:
            assert torch.equal(got, want)
    q, s = tf.quantize_tokens(torch.empty(0, 64, device=dev))
    assert q.shape == (0, 64) and s.shape == (0, 1)


def test_fp8_refused_in_one_line_on_a_gpu_without_fp8_tensor_cores(monkeypatch):
    assert fp8_capability_problem((8, 9)) is None and fp8_capability_problem((9, 0)) is None
    assert "sm_80" in (fp8_capability_problem((8, 0)) or "")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    cuda = torch.device("cuda")
    with pytest.raises(ConfigError) as e:
        plan_weights(ModelConfig(quantization="fp8", device="cuda"), cuda, None)
    assert "\n" not in str(e.value) and "8.9" in str(e.value)
    # an FP8 checkpoint under auto is dequantized there instead (and says why)
    plan = plan_weights(ModelConfig(device="cuda"), cuda, None, fp8_checkpoint=True)
    assert plan.method == "none" and "sm_80" in plan.reason
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    assert plan_weights(ModelConfig(quantization="fp8"), cuda, None).method == "fp8"


def test_fp8_config_rules():
    assert ModelConfig(quantization="fp8", device="cuda").quantization == "fp8"
    with pytest.raises(ConfigError, match="bfloat16 or float32"):
        ModelConfig(quantization="fp8", dtype="float16")
    with pytest.raises(ConfigError, match="runs on the CPU"):
        ModelConfig(quantization="int8", device="cuda")
    plan = plan_weights(ModelConfig(quantization="fp8"), torch.device("cpu"), None)
    assert plan.method == "fp8" and "emulated" in plan.reason
