"""Which few-row linears take the split-K GEMV (triton_gemv.py) instead of F.linear: a
measured choice, made once at start on CUDA, so the route is never slower than cuBLAS.

    start (before the graphs)   for every [N, K] shape of the model's routed linears
                                (ops.Linear: qkv, o, gate_up, down, the head) and each row
                                bucket the decode graphs capture (1, 2, 4, 8): time both,
                                keep the GEMV where it measured faster by MARGIN
    a call (TritonOps.linear)   (rows, N, K) in the chosen set: the GEMV; else F.linear

--gemv off (docs/flags.md) chooses nothing; --enforce-eager does not measure either (its
steps pay Triton's host launch cost, which the graphs' timing below does not see). A CPU
backend never gets here: its op sets' `linear` is F.linear itself (ops.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

import torch
import torch.nn.functional as F
from torch import nn

from common.log import get_logger
from scheduler_worker.backends import triton_gemv
from scheduler_worker.backends.ops import Linear

log = get_logger("cuda")
ROW_BUCKETS = (1, 2, 4, 8)
MARGIN = 0.02  # the GEMV must be this much faster: a tie keeps cuBLAS, noise does not flip it
IMPLS = ("linear", "gemv")
Shape = tuple[int, int]  # a weight's [N, K]
Key = tuple[int, int, int]  # (rows, N, K)
# seconds one call of `impl` takes at (rows, N, K), as the decode step would run it
Measure = Callable[[str, int, int, int], float]


class GemvRoutes:
    """The chosen (rows, N, K) set, the timings it was chosen from, and the workspace the
    GEMV's K splits share (made with the choice, before any capture)."""

    def __init__(self, mode: str = "auto") -> None:
        self.mode = mode
        self.faster: set[Key] = set()
        self.timings: dict[Key, tuple[float, float]] = {}  # seconds: F.linear, the GEMV
        self.workspace: triton_gemv.GemvWorkspace | None = None

    def picks(self, x: torch.Tensor, weight: torch.Tensor) -> bool:
        """Whether this call takes the GEMV (the caller checked x is 2-D)."""
        key = (x.shape[0], weight.shape[0], weight.shape[1])
        return key in self.faster and triton_gemv.supports(x, weight)

    def linear(
        self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
    ) -> torch.Tensor:
        if x.dim() == 2 and self.workspace is not None and self.picks(x, weight):
            return triton_gemv.gemv(x, weight, bias, self.workspace)
        return F.linear(x, weight, bias)

    def choose(
        self,
        shapes: Iterable[Shape],
        measure: Measure,
        buckets: Iterable[int] = ROW_BUCKETS,
    ) -> None:
        """Time what is not timed yet (a shape's keys are measured once, however many
        layers share it) and keep the GEMV where it is faster by MARGIN. Off: nothing."""
        if self.mode == "off":
            return
        rows = [b for b in buckets if b <= triton_gemv.MAX_ROWS]
        for n, k in shapes:
            for m in rows:
                key = (m, n, k)
                if key in self.timings:
                    continue
                t_linear, t_gemv = (measure(impl, m, n, k) for impl in IMPLS)
                self.timings[key] = (t_linear, t_gemv)
                if t_gemv < t_linear * (1.0 - MARGIN):
                    self.faster.add(key)

    def verify(
        self, weights: dict[Shape, list[tuple[torch.Tensor, torch.Tensor | None]]]
    ) -> list[Key]:
        """Each chosen key's GEMV against F.linear on one random input, both rounded to the
        weight's dtype; a key whose result differs by more than two roundings of the output's
        magnitude goes back to F.linear (the kernel has not run on a GPU: a wrong result at
        start must cost speed, not answers). Returns the keys dropped."""
        wrong: list[Key] = []
        for m, n, k in sorted(self.faster):
            w, b = weights[(n, k)][0]
            gen = torch.Generator(device=w.device).manual_seed(1)
            x = torch.randn(m, k, device=w.device, dtype=w.dtype, generator=gen)
            assert self.workspace is not None
            got = triton_gemv.gemv(x, w, b, self.workspace).float()
            ref = F.linear(x, w, b).float()
            eps = torch.finfo(w.dtype).eps
            if not bool(((got - ref).abs() <= 2 * eps * ref.abs().amax() + 1e-6).all()):
                wrong.append((m, n, k))
        self.faster.difference_update(wrong)
        return wrong

    def report(self) -> list[str]:
        """One line per measured key: µs a call each way and the pick."""
        lines = []
        for (m, n, k), (t_lin, t_gv) in sorted(self.timings.items(), key=lambda i: i[0][1:]):
            pick = "gemv" if (m, n, k) in self.faster else "F.linear"
            lines.append(
                f"[{n}x{k}] rows {m}: F.linear {t_lin * 1e6:.1f} us, gemv {t_gv * 1e6:.1f} us"
                f" -> {pick}"
            )
        return lines


def routed_weights(model: nn.Module) -> dict[Shape, list[tuple[torch.Tensor, torch.Tensor | None]]]:
    """The routed linears' (weight, bias) by [N, K], in module order, each tensor once
    (a tied head shares the embedding's); only dtypes the GEMV takes."""
    by_shape: dict[Shape, list[tuple[torch.Tensor, torch.Tensor | None]]] = {}
    seen: set[int] = set()
    for mod in model.modules():
        if not isinstance(mod, Linear) or mod.weight.dtype not in triton_gemv.DTYPES:
            continue
        w = mod.weight
        if w.data_ptr() in seen or w.stride(1) != 1:
            continue
        seen.add(w.data_ptr())
        by_shape.setdefault((w.shape[0], w.shape[1]), []).append((w, mod.bias))
    return by_shape


def graph_measure(
    weights: dict[Shape, list[tuple[torch.Tensor, torch.Tensor | None]]],
    workspace: triton_gemv.GemvWorkspace,
    replays: int = 3,
) -> Measure:
    """On CUDA: one call of `impl` per weight of the shape (every layer's: a different
    weight each call, cold in L2 as in the step, where the other layers' weights pass
    between), captured in one CUDA graph as the decode graphs run them; the best of
    `replays` replays (after one warm replay) over the weights' count. Unrun on a GPU so
    far (docs/benchmarks.md, "A few-row GEMV for the GPU's decode")."""

    def measure(impl: str, rows: int, n: int, k: int) -> float:
        pairs = weights[(n, k)]
        w0 = pairs[0][0]
        gen = torch.Generator(device=w0.device).manual_seed(0)  # the global RNG untouched
        x = torch.randn(rows, k, device=w0.device, dtype=w0.dtype, generator=gen)

        def run() -> None:
            for w, b in pairs:
                if impl == "gemv":
                    triton_gemv.gemv(x, w, b, workspace)
                else:
                    F.linear(x, w, b)

        return time_graph(run, replays) / len(pairs)

    return measure


def time_graph(run: Callable[[], None], replays: int) -> float:
    """Seconds one replay of `run` captured in a CUDA graph takes (best of `replays`)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        run()  # Triton's compile, cuBLAS' plans: outside the graph
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    graph.replay()
    best = math.inf
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(replays):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) / 1e3)
    del graph
    return best


def choose_at_start(
    routes: GemvRoutes,
    model: nn.Module,
    num_sms: int,
    buckets: Iterable[int],
    measure: Measure | None = None,
) -> list[str]:
    """The backend's start: the workspace sized for the model's routed shapes, then the
    choice at the decode graphs' row buckets (`measure`: graph_measure, a GPU's; tests
    pass a stand-in). Returns the report's lines (none when off or nothing is routed)."""
    if routes.mode == "off":
        return []
    weights = routed_weights(model)
    if not weights:
        return []
    device = next(iter(weights.values()))[0][0].device
    try:
        routes.workspace = triton_gemv.GemvWorkspace(device, num_sms, weights)
        routes.choose(weights, measure or graph_measure(weights, routes.workspace), buckets)
        wrong = routes.verify(weights)
    except Exception as e:  # noqa: BLE001 - a kernel that cannot run must not stop the server
        log.warning("few-row GEMV off: it failed at start (%s: %s)", type(e).__name__, e)
        routes.faster.clear()
        routes.workspace = None
        return [f"off: it failed at start ({type(e).__name__}: {e})"]
    return routes.report() + [
        f"[{n}x{k}] rows {m}: differs from F.linear -> F.linear" for m, n, k in wrong
    ]
