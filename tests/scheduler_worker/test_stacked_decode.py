"""A stacked projection whose parts the file stores in different GGUF types (q in one,
k and v in another, as Q4_K_M files do) stays on the one-call decode step: decode_layers
takes the projection as its parts and must equal the module path bit for bit."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from common.config import CacheConfig, EngineConfig, ModelConfig
from scheduler_worker import kernels
from scheduler_worker.quant.linear import QuantLinear, quantize_weight
from scheduler_worker.quant.stacked import StackedLinear, kernel_parts
from tests.conftest import fused_and_module_decode

needs_kernels = pytest.mark.skipif(not kernels.load(), reason="the C++ kernels are not built here")


def _split(lin: nn.Module, widths: list[int], methods: list[str], seed: int) -> StackedLinear:
    """A stand-in for `lin`: random weights of its shape cut into parts of `widths`, each
    part quantized with its method (the test compares two paths over the same weights)."""
    gen = torch.Generator().manual_seed(seed)
    parts, isa = [], lin.isa
    for width, method in zip(widths, methods, strict=True):
        w = torch.randn(width, lin.in_features, generator=gen) * 0.05
        part = QuantLinear(quantize_weight(w, method), None, torch.float32, isa)
        part.step_rows = lin.step_rows
        parts.append(part)
    bias = None if lin.bias is None else lin.bias.detach().clone()
    return StackedLinear(parts, lin.in_features, bias)


@needs_kernels
@pytest.mark.parametrize("kind", ["llama", "qwen2"])  # qwen2: a bias over the whole stack
def test_one_call_decode_takes_mixed_format_stacks(kind, tiny_model_dirs):
    from scheduler_worker.model_runner import ModelRunner

    src = tiny_model_dirs[kind]
    config = EngineConfig(
        model=ModelConfig(model=str(src), dtype="float32", device="cpu", quantization="int4"),
        cache=CacheConfig(block_size=4, num_blocks=64),
    )
    runner = ModelRunner(config, src)
    model = runner.model
    a = runner.args
    q, kv = a.num_heads * a.head_dim, a.num_kv_heads * a.head_dim
    for i, layer in enumerate(model.layers):
        attn, mlp = layer.self_attn, layer.mlp
        attn.qkv_proj = _split(attn.qkv_proj, [q, kv, kv], ["int4", "int8", "int8"], i)
        half = mlp.gate_up_proj.out_features // 2
        mlp.gate_up_proj = _split(mlp.gate_up_proj, [half, half], ["int8", "int4"], 100 + i)
    assert all(kernel_parts(layer.self_attn.qkv_proj) for layer in model.layers)
    assert model.enable_decode_layers(), "mixed-format stacks keep the one-call plan"
    fused, modules, fused_caches = fused_and_module_decode(runner, model)
    assert torch.isfinite(fused).all() and torch.equal(fused, modules)
    for (k1, v1), (k2, v2) in zip(fused_caches, runner.kv_caches, strict=True):
        assert torch.equal(k1, k2) and torch.equal(v1, v2)


def test_kernel_parts_refuses_a_part_off_the_kernels():
    parts = [nn.Linear(8, 4), nn.Linear(8, 4)]
    for p in parts:
        p.source = "F32"
    assert kernel_parts(StackedLinear(parts, 8, None)) is None
