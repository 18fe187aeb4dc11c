"""One kernel dispatch: every C++ op takes the ISA path chosen once in Python (--kernels,
ZEROSERVE_CPU_KIND), clamped in C++ to what the CPU has."""

from __future__ import annotations

import pytest
import torch

from common import cpu
from common.config import CacheConfig, ConfigError, EngineConfig, ModelConfig
from scheduler_worker import kernels
from scheduler_worker.model_runner import ModelRunner, SeqInput

pytestmark = pytest.mark.skipif(not kernels.load(), reason="the C++ kernels are not built here")
ops = torch.ops.zeroserve


def _best() -> int:
    return int(ops.cpu_isa())


def _ops_at(isa: int) -> list[torch.Tensor]:
    """rms_norm and decode attention on fixed inputs: long float32 reductions, whose
    rounding shows which vector width summed them."""
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(64, 4096, generator=g), torch.rand(4096, generator=g) + 0.5
    kc, vc = torch.randn(2, 3, 16, 8, 128, generator=g).unbind(0)
    q = torch.randn(4, 16, 128, generator=g)
    tables = torch.tensor([[0, 1, 2], [2, 1, 0], [1, 0, 2], [0, 2, 1]])
    lens = torch.tensor([40, 17, 48, 1])
    return [
        ops.rms_norm(x, None, w, 1e-6, isa),
        ops.paged_decode_attention(q, kc, vc, tables, lens, 128**-0.5, isa),
    ]


def test_the_isa_argument_selects_the_code_and_is_clamped_to_the_cpu():
    best = _best()
    at = {isa: _ops_at(isa) for isa in range(best + 1)}
    avx512 = kernels.isa_index("avx512")
    for isa in range(1, min(best, avx512) + 1):  # each path sums in its own vector width
        assert any(not torch.equal(a, b) for a, b in zip(at[isa], at[isa - 1])), isa
        for a, b in zip(at[isa], at[0]):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    if best > avx512:  # AMX: the float ops run their AVX-512 code
        assert all(torch.equal(a, b) for a, b in zip(at[best], at[avx512]))
    for asked, runs in ((99, best), (-3, 0)):  # beyond the CPU: its best; below: portable
        assert all(torch.equal(a, b) for a, b in zip(_ops_at(asked), at[runs]))


@pytest.mark.skipif("avx2" not in cpu.cpu_flags(), reason="no AVX2 here")
@pytest.mark.parametrize("quantization", ["none", "int4"])
def test_an_emulated_avx2_cpu_runs_every_op_on_the_avx2_path(
    quantization, tiny_model_dirs, monkeypatch
):
    monkeypatch.setenv("ZEROSERVE_CPU_KIND", "avx2")
    cpu.cpu_flags.cache_clear()
    try:
        src = tiny_model_dirs["llama"]
        config = EngineConfig(
            model=ModelConfig(
                model=str(src), dtype="float32", device="cpu", quantization=quantization
            ),
            cache=CacheConfig(block_size=4, num_blocks=32),
        )
        runner = ModelRunner(config, src)
        assert cpu.cpu_kind_label().startswith("avx2 (emulated on ")
    finally:
        cpu.cpu_flags.cache_clear()
    avx2 = kernels.isa_index("avx2")
    assert runner.kernel_isa == "avx2"
    layers = [m for m in runner.model.modules() if hasattr(m, "ops")]
    assert layers and all(m.ops.kernel_isa == avx2 for m in layers)
    linears = [m for m in runner.model.modules() if hasattr(m, "isa_index")]
    assert all(m.isa_index == avx2 for m in linears) and (quantization == "none") != bool(linears)
    plan = runner.model.decode_plan
    assert plan is None if quantization == "none" else plan.isa == avx2
    meta = runner.prepare([SeqInput([3, 4, 5], 0, [1])])[2]
    assert meta.kernel_isa == avx2 and meta.decode_kernel == "paged"


def test_kernels_torch_runs_no_cpp_op(tiny_model_dirs):
    src = tiny_model_dirs["llama"]
    config = EngineConfig(
        model=ModelConfig(model=str(src), dtype="float32", device="cpu", kernels="torch"),
        cache=CacheConfig(block_size=4, num_blocks=32),
    )
    runner = ModelRunner(config, src)
    assert runner.kernel_isa is None and runner.decode_kernel != "paged"
    assert all(m.ops.kernel_isa is None for m in runner.model.modules() if hasattr(m, "ops"))


@pytest.mark.parametrize("flags", [{"amx_bf16"}, set()])
def test_the_dense_prefill_copy_is_opt_in(monkeypatch, flags, tmp_path):
    """On an AMX (or AVX2 + native bf16) CPU the bf16 copy for prompt tokens is kept only
    with --prefill-dense-copy: by default the weights held are the file's bytes."""
    from scheduler_worker.quant import plan

    monkeypatch.setattr(plan, "has_native_bf16", lambda: True)
    monkeypatch.setattr(plan, "cpu_flags", lambda: flags)
    monkeypatch.setattr(plan, "kernel_path", lambda choice: "avx2")
    gguf = tmp_path / "m.gguf"
    lean = plan.plan_weights(ModelConfig(), torch.device("cpu"), gguf)
    assert (lean.method, lean.isa, lean.dense_dtype) == ("gguf", "avx2", None)
    copy = plan.plan_weights(ModelConfig(prefill_dense_copy=True), torch.device("cpu"), gguf)
    assert copy.dense_dtype == torch.bfloat16


def test_kernels_amx_is_refused_where_the_os_refuses_the_tiles(monkeypatch):
    # the CPU's flags name AMX, but the C++ side could not get the tile permission: asking
    # for amx is a clear start-up error, auto takes what the C++ side runs
    monkeypatch.setattr(kernels, "check_kernel_choice", lambda choice: None)  # flags: AMX
    monkeypatch.setattr(kernels, "best_isa", lambda: "avx512")
    with pytest.raises(ConfigError, match="--kernels amx: the kernels run avx512 at best"):
        kernels.kernel_path("amx")
    assert kernels.kernel_path("auto") == "avx512"
    assert kernels.kernel_path("avx512") == "avx512"
