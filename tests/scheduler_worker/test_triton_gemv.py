"""The few-row split-K GEMV (backends/triton_gemv.py) against F.linear in float32, and its
measured route (backends/gemv_choice.py) with a stand-in timer: the faster side chosen,
nothing when off, each shape timed once; dense layers routed through the op set.

Without CUDA the kernel runs in Triton's interpreter on CPU tensors (tiny shapes: N and K
not multiples of the blocks); the tests marked for CUDA run in the GPU check.
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F
from torch import nn

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

from common.config import ConfigError, ModelConfig  # noqa: E402
from scheduler_worker.backends import gemv_choice, triton_gemv  # noqa: E402
from scheduler_worker.backends.gemv_choice import GemvRoutes, choose_at_start  # noqa: E402
from scheduler_worker.backends.ops import TORCH_OPS, Linear, TorchOps  # noqa: E402
from scheduler_worker.backends.triton_gemv import GemvWorkspace, gemv, num_splits  # noqa: E402
from scheduler_worker.backends.triton_ops import TritonOps  # noqa: E402

DEVICE = torch.device(
    "cuda" if torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1" else "cpu"
)
ULP = {torch.bfloat16: 2.0**-7, torch.float16: 2.0**-10}  # one rounding (the interpreter
# truncates to bfloat16 where a GPU rounds: still within one ulp)
N, K = 100, 300  # 2 column tiles (the second partial), 3 blocks of K (the last partial)


def operands(m: int, n: int, k: int, dtype: torch.dtype, bias: bool, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=gen).to(dtype).to(DEVICE)
    w = (torch.randn(n, k, generator=gen) / k**0.5).to(dtype).to(DEVICE)
    b = torch.randn(n, generator=gen).to(dtype).to(DEVICE) if bias else None
    return x, w, b


def reference(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    return F.linear(x.float(), w.float(), None if b is None else b.float())


def workspace(shapes, num_sms: int = 8) -> GemvWorkspace:
    return GemvWorkspace(DEVICE, num_sms, shapes)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("split", [1, 3])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("m", [1, 3, 8])
def test_gemv_equals_f_linear_in_float32_within_one_rounding(m, bias, split, dtype):
    x, w, b = operands(m, N, K, dtype, bias)
    ws = GemvWorkspace(DEVICE, 8, [(N, K)], max_split=split)
    y = gemv(x, w, b, ws, split=split)
    assert y.shape == (m, N) and y.dtype == dtype
    torch.testing.assert_close(y.float(), reference(x, w, b), rtol=ULP[dtype], atol=1e-3)
    # every launch leaves its counters at zero, so the next one (or a graph's replay) works
    assert not ws.counters.any()
    assert torch.equal(gemv(x, w, b, ws, split=split), y)


def test_the_split_is_chosen_by_n_k_and_sms_alone_and_sized_by_the_workspace():
    # Llama-3.2-1B on 132 SMs: o_proj splits (32 column tiles), the head does not
    assert num_splits(2048, 2048, 132) == 8
    assert num_splits(2048, 8192, 132) == 16
    assert num_splits(128256, 2048, 132) == 1
    assert num_splits(2048, 200, 132) == 1  # two blocks of K: nothing to split
    for n, k in [(2048, 2048), (3072, 2048), (16384, 2048), (100, 1100)]:
        s = num_splits(n, k, 132)
        assert s & (s - 1) == 0 and -(-k // triton_gemv.BLOCK_K) >= s * triton_gemv.MIN_K_BLOCKS
    # the default split on a small device: K 1100 over 8 SMs is split, within the workspace
    n, k = 100, 1100
    ws = workspace([(n, k)])
    split = num_splits(n, k, 8)
    assert split > 1 and ws.partials.numel() == split * triton_gemv.MAX_ROWS * n
    with pytest.raises(AssertionError):  # a wider weight than the workspace was made for
        gemv(
            operands(8, 4 * n, k, torch.bfloat16, False)[0],
            torch.zeros(4 * n, k).to(torch.bfloat16).to(DEVICE),
            None,
            ws,
        )
    x, w, b = operands(8, n, k, torch.bfloat16, True, seed=1)
    y = gemv(x, w, b, ws)
    torch.testing.assert_close(y.float(), reference(x, w, b), rtol=ULP[torch.bfloat16], atol=1e-3)
    assert int(ws.counters.abs().sum()) == 0


def test_gemv_refuses_what_it_does_not_take():
    x, w, _ = operands(9, N, K, torch.bfloat16, False)
    assert not triton_gemv.supports(x, w)  # 9 rows
    assert not triton_gemv.supports(x[:2].float(), w.float())  # float32
    assert not triton_gemv.supports(x[:2, ::2], w[:, ::2])  # strided along K
    assert triton_gemv.supports(x[:8], w)


class StandInTimer:
    """measure(impl, rows, N, K) from a table; counts its calls."""

    def __init__(self, gemv_faster: set[tuple[int, int, int]], ratio: float = 0.5) -> None:
        self.gemv_faster, self.ratio = gemv_faster, ratio
        self.calls: list[tuple[str, int, int, int]] = []

    def __call__(self, impl: str, rows: int, n: int, k: int) -> float:
        self.calls.append((impl, rows, n, k))
        if impl == "linear":
            return 10e-6
        return 10e-6 * (self.ratio if (rows, n, k) in self.gemv_faster else 1.5)


def test_the_choice_keeps_the_faster_caches_per_shape_and_does_nothing_when_off():
    timer = StandInTimer({(1, 64, 32), (8, 64, 32)})
    routes = GemvRoutes("auto")
    routes.choose([(64, 32), (48, 32)], timer, buckets=[1, 2, 4, 8, 16])
    assert routes.faster == {(1, 64, 32), (8, 64, 32)}
    assert len(timer.calls) == 2 * 2 * 4  # both impls, 2 shapes, 4 buckets (16 > MAX_ROWS)
    routes.choose([(64, 32), (48, 32)], timer)  # measured already: no new timing
    assert len(timer.calls) == 16
    assert any("-> gemv" in line for line in routes.report())
    # within MARGIN of F.linear is no win: cuBLAS stays
    close = GemvRoutes("auto")
    close.choose([(64, 32)], StandInTimer({(1, 64, 32)}, ratio=0.99), buckets=[1])
    assert close.faster == set()
    off, never = GemvRoutes("off"), StandInTimer({(1, 64, 32)})
    off.choose([(64, 32)], never)
    assert never.calls == [] and off.faster == set()


class TinyStack(nn.Module):
    """Two layers' projections of one shape and one of another, and a head tied to them."""

    def __init__(self, dtype: torch.dtype) -> None:
        super().__init__()
        self.a = nn.ModuleList(Linear(K, N, bias=True) for _ in range(2))
        self.b = Linear(N, 40, bias=False)
        self.head = Linear(K, N, bias=False)
        self.head.weight = self.a[0].weight
        self.to(device=DEVICE, dtype=dtype)


def test_the_backend_routes_dense_layers_as_measured(monkeypatch):
    model = TinyStack(torch.bfloat16)
    weights = gemv_choice.routed_weights(model)
    assert {s: len(v) for s, v in weights.items()} == {(N, K): 2, (40, N): 1}  # tied once
    ops = TritonOps("auto")
    for mod in model.modules():
        if hasattr(mod, "ops"):
            mod.ops = ops
    timer = StandInTimer({(1, N, K)})
    lines = choose_at_start(ops.gemv, model, 8, [1, 2, 4, 8, 16, 24], timer)
    assert len(lines) == 8 and len(timer.calls) == 16
    launched: list[tuple[int, int]] = []
    real = triton_gemv.gemv

    def spy(x, w, b, ws, split=None):
        launched.append((x.shape[0], w.shape[0]))
        return real(x, w, b, ws, split)

    monkeypatch.setattr(triton_gemv, "gemv", spy)
    gen = torch.Generator().manual_seed(3)
    for rows in (1, 2):
        x = torch.randn(rows, K, generator=gen).to(torch.bfloat16).to(DEVICE)
        layer = model.a[1]
        y = layer(x)
        ref = reference(x, layer.weight, layer.bias)
        torch.testing.assert_close(y.float(), ref, rtol=ULP[torch.bfloat16], atol=1e-3)
        model.b(y)
    assert launched == [(1, N)]  # one row on the chosen shape; two rows and [40, N]: cuBLAS


def test_the_cpu_op_sets_call_f_linear_itself():
    # no wrapper on the CPU path: a routed layer costs what nn.Linear's call does
    assert TorchOps.linear is F.linear and TORCH_OPS.linear is F.linear
    plain = nn.Linear(K, N)
    routed = Linear(K, N)
    routed.load_state_dict(plain.state_dict())
    x = torch.randn(3, K)
    assert torch.equal(routed(x), plain(x))


def test_the_flag_takes_auto_or_off():
    assert ModelConfig().gemv == "auto" and ModelConfig(gemv="off").gemv == "off"
    with pytest.raises(ConfigError, match="gemv"):
        ModelConfig(gemv="always")


needs_gpu = pytest.mark.skipif(DEVICE.type != "cuda", reason="needs a CUDA GPU (compiled)")


@needs_gpu
def test_a_captured_split_gemv_replays_what_it_computes_eagerly():
    n, k = 2048, 2048  # Llama-3.2-1B's o_proj: split on any GPU of 32+ SMs
    sms = torch.cuda.get_device_properties(DEVICE).multi_processor_count
    assert num_splits(n, k, sms) > 1
    ws = workspace([(n, k)], sms)
    x, w, b = operands(4, n, k, torch.bfloat16, True, seed=5)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        gemv(x, w, b, ws)  # the compile, outside the graph
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = gemv(x, w, b, ws)
    for seed in range(3):  # new inputs each replay, as the decode graphs get them
        x.copy_(operands(4, n, k, torch.bfloat16, False, seed=10 + seed)[0])
        graph.replay()
        eager = gemv(x, w, b, ws)
        assert torch.equal(out, eager)  # the split's sum in a fixed order: bit for bit
        torch.testing.assert_close(out.float(), reference(x, w, b), rtol=2**-7, atol=1e-2)
    torch.cuda.synchronize()
    assert int(ws.counters.abs().sum()) == 0


@needs_gpu
def test_the_gpu_timer_times_both_sides_of_every_shape():
    model = TinyStack(torch.bfloat16)
    routes = GemvRoutes("auto")
    sms = torch.cuda.get_device_properties(DEVICE).multi_processor_count
    lines = choose_at_start(routes, model, sms, [1, 8])
    assert len(lines) == 4 and len(routes.timings) == 4
    assert all(0 < t < 1e-2 for pair in routes.timings.values() for t in pair)


def test_a_gemv_that_fails_or_differs_at_start_leaves_f_linear(monkeypatch):
    """The kernel has not run on a GPU: one that raises at start turns the route off, one
    whose result differs from F.linear loses that key; the server starts either way."""
    model = TinyStack(torch.bfloat16)
    real = triton_gemv.gemv

    def off_by_one(x, w, b, ws, split=None):
        y = real(x, w, b, ws, split)
        return y + 1 if x.shape[0] == 1 else y

    monkeypatch.setattr(triton_gemv, "gemv", off_by_one)
    routes = GemvRoutes("auto")
    lines = choose_at_start(routes, model, 8, [1, 2], StandInTimer({(1, N, K), (2, N, K)}))
    assert routes.faster == {(2, N, K)}
    assert any("rows 1: differs from F.linear" in line for line in lines)

    def broken(*args, **kwargs):
        raise RuntimeError("no such PTX")

    monkeypatch.setattr(triton_gemv, "gemv", broken)
    routes = GemvRoutes("auto")
    lines = choose_at_start(routes, model, 8, [1], StandInTimer({(1, N, K)}))
    assert routes.faster == set() and routes.workspace is None
    assert lines == ["off: it failed at start (RuntimeError: no such PTX)"]
    x = torch.randn(1, K).to(torch.bfloat16).to(DEVICE)
    w = model.a[1].weight
    torch.testing.assert_close(routes.linear(x, w, None), F.linear(x, w))
