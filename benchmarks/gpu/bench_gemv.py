"""The few-row split-K GEMV (scheduler_worker/backends/triton_gemv.py) against F.linear
(cuBLAS) on the dense linears of Llama-3.2-1B and Llama-3.1-8B (bf16: qkv, o, gate_up,
down and the 128,256-id head), at 1, 2, 4 and 8 rows, timed as the backend's start times
them (gemv_choice.graph_measure: each shape's calls over several copies of its weight, cold
in L2 as in a decode step, captured in a CUDA graph): µs a call, GB/s of weight + x + y,
the K split, and which side the route picks (GemvRoutes, the same margin). Each shape is
also checked against float32 F.linear at the largest row count (within one bf16 rounding).

    PYTHONPATH=<project> python benchmarks/gpu/bench_gemv.py [--models 1b,8b]
        [--rows 1,2,4,8] [--replays 5] [--splits 1,2,4,8,16 --split-rows 1]
    (--splits: the GEMV also timed at fixed K splits, per shape: data for num_splits' rule)
    ... --device cpu: the plumbing only, under TRITON_INTERPRET=1 with tiny shapes and a
        wall-clock timer (its figures say nothing of a GPU)
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time

import torch
import torch.nn.functional as F

# (hidden, intermediate, query heads, KV heads, head_dim, layers, vocab)
MODELS = {
    "1b": (2048, 8192, 32, 8, 64, 16, 128256),
    "8b": (4096, 14336, 32, 8, 128, 32, 128256),
    "tiny": (320, 640, 4, 2, 64, 2, 500),  # --device cpu: 3 blocks of K, split on 8 "SMs"
}
L2_BYTES = 50 << 20  # an H100's (H200: 60 MiB): a shape's copies cover 4x this or its layers


def shapes_of(model: str) -> list[tuple[str, int, int, int]]:
    """(name, N, K, copies) of a model's dense linears, copies up to its layer count."""
    hidden, inter, heads, kv_heads, head_dim, layers, vocab = MODELS[model]
    qkv = (heads + 2 * kv_heads) * head_dim
    out = []
    for name, n, k in [
        ("qkv", qkv, hidden), ("o", hidden, heads * head_dim), ("gate_up", 2 * inter, hidden),
        ("down", hidden, inter), ("head", vocab, hidden),
    ]:  # fmt: skip
        copies = 1 if name == "head" else min(layers, max(1, -(-4 * L2_BYTES // (2 * n * k))))
        out.append((name, n, k, copies))
    return out


def wall_measure(weights, workspace, gemv, replays: int):
    """The CPU's stand-in for graph_measure: best wall time over the copies, a call."""

    def measure(impl: str, rows: int, n: int, k: int) -> float:
        pairs = weights[(n, k)]
        x = torch.randn(rows, k, dtype=pairs[0][0].dtype)
        best = math.inf
        for _ in range(replays + 1):
            t0 = time.perf_counter()
            for w, b in pairs:
                gemv(x, w, b, workspace) if impl == "gemv" else F.linear(x, w, b)
            best = min(best, time.perf_counter() - t0)
        return best / len(pairs)

    return measure


def split_time(gemv, pairs, x, workspace, split: int, replays: int, on_gpu: bool) -> float:
    """Seconds a call of the GEMV at a fixed K split over a shape's copies: graph replays
    on a GPU, one wall-clock pass on the CPU."""

    def run() -> None:
        for w, b in pairs:
            gemv(x, w, b, workspace, split=split)

    if on_gpu:
        from scheduler_worker.backends.gemv_choice import time_graph

        return time_graph(run, replays) / len(pairs)
    t0 = time.perf_counter()
    run()
    return (time.perf_counter() - t0) / len(pairs)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--models", default=None, help="1b,8b on cuda; tiny on cpu")
    ap.add_argument("--rows", default="1,2,4,8")
    ap.add_argument("--replays", type=int, default=None, help="5 on cuda, 1 on cpu")
    ap.add_argument(
        "--splits", default="", help="also time the GEMV at these fixed K splits (e.g. 1,4,16)"
    )
    ap.add_argument("--split-rows", type=int, default=1, help="the sweep's row count")
    args = ap.parse_args()
    on_gpu = args.device == "cuda"
    if not on_gpu:
        os.environ["TRITON_INTERPRET"] = "1"  # before the kernel is defined
    elif not torch.cuda.is_available():
        print("needs a CUDA GPU (or --device cpu: the plumbing)", file=sys.stderr)
        return 1
    from scheduler_worker.backends import triton_gemv
    from scheduler_worker.backends.gemv_choice import GemvRoutes, graph_measure

    dev = torch.device(args.device)
    models = (args.models or ("1b,8b" if on_gpu else "tiny")).split(",")
    rows = [int(r) for r in args.rows.split(",")]
    replays = args.replays or (5 if on_gpu else 1)
    sms = torch.cuda.get_device_properties(dev).multi_processor_count if on_gpu else 8
    name = torch.cuda.get_device_name(dev) if on_gpu else "CPU (interpreter: plumbing only)"
    timer = f"best of {replays} graph replays" if on_gpu else "wall clock"
    print(f"{name}, {sms} SMs, bf16; µs a call ({timer}), GB/s")
    gen = torch.Generator(device=dev).manual_seed(0)
    for model in models:
        shapes = shapes_of(model)
        weights = {
            (n, k): [
                (torch.randn(n, k, device=dev, generator=gen, dtype=torch.bfloat16) / k**0.5, None)
                for _ in range(copies)
            ]
            for _, n, k, copies in shapes
        }
        ws = triton_gemv.GemvWorkspace(dev, sms, weights)
        measure = (
            graph_measure(weights, ws, replays)
            if on_gpu
            else wall_measure(weights, ws, triton_gemv.gemv, replays)
        )
        routes = GemvRoutes("auto")
        t0 = time.perf_counter()
        routes.choose(list(weights), measure, rows)
        seconds = time.perf_counter() - t0
        print(f"\n{model}: {'shape':>8} {'N x K':>14} {'rows':>4} {'split':>5} "
              f"{'F.linear us':>11} {'GB/s':>6} {'gemv us':>8} {'GB/s':>6}  pick")  # fmt: skip
        step = {"F.linear": 0.0, "picked": 0.0}  # batch 1: one layer's four, x layers, + head
        layers = MODELS[model][5]
        for label, n, k, _ in shapes:
            split = triton_gemv.num_splits(n, k, sms)
            for m in rows:
                t_lin, t_gv = routes.timings[(m, n, k)]
                nbytes = 2 * (n * k + m * k + m * n)
                pick = "gemv" if (m, n, k) in routes.faster else "F.linear"
                print(f"{'':>4}{label:>8} {n:>7}x{k:<6} {m:>4} {split:>5} {t_lin * 1e6:>11.1f} "
                      f"{nbytes / t_lin / 1e9:>6.0f} {t_gv * 1e6:>8.1f} "
                      f"{nbytes / t_gv / 1e9:>6.0f}  {pick}")  # fmt: skip
                if m == 1:
                    times = 1 if label == "head" else layers
                    step["F.linear"] += t_lin * times
                    step["picked"] += (t_gv if pick == "gemv" else t_lin) * times
            w, _ = weights[(n, k)][0]
            x = torch.randn(max(rows), k, device=dev, generator=gen, dtype=torch.bfloat16)
            err = (triton_gemv.gemv(x, w, None, ws).float() - F.linear(x.float(), w.float())).abs()
            bound = F.linear(x.float(), w.float()).abs() * 2.0**-7 + 1e-3
            print(f"{'':>4}{label:>8} check at {max(rows)} rows: max |gemv - fp32| "
                  f"{err.max().item():.2e}, within one bf16 rounding: "
                  f"{bool((err <= bound).all())}")  # fmt: skip
        if args.splits:  # data for num_splits' rule: the GEMV at fixed splits
            sweep = [int(s) for s in args.splits.split(",")]
            ws_sweep = triton_gemv.GemvWorkspace(dev, sms, weights, max_split=max(sweep))
            m = args.split_rows
            for label, n, k, _ in shapes:
                pairs = weights[(n, k)]
                x = torch.randn(m, k, device=dev, generator=gen, dtype=torch.bfloat16)
                got = []
                for s in sweep:
                    t = split_time(triton_gemv.gemv, pairs, x, ws_sweep, s, replays, on_gpu)
                    got.append(f"{s}: {t * 1e6:.1f}")
                print(f"{'':>4}{label:>8} split sweep at {m} rows, us: {', '.join(got)} "
                      f"(rule: {triton_gemv.num_splits(n, k, sms)})")  # fmt: skip
        print(f"  {model} batch 1, the linears of a step: F.linear {step['F.linear'] * 1e6:.0f} "
              f"us, as picked {step['picked'] * 1e6:.0f} us; chosen in {seconds:.2f} s "
              f"({'one run, this GPU' if on_gpu else 'CPU interpreter: plumbing only'})")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
