"""Decode attention's context splits on a GPU, as the decode graphs run it: Llama-3.2-1B's
attention shapes (32 query heads over 8 KV heads, head_dim 64, bf16, 16-token blocks on
shuffled tables), its 16 layers' kernels and merges captured in one CUDA graph and replayed
(µs a layer: the replay's time / 16).

Per batch and context: the graph at the cap its bucket captures (the backend's splits(),
max_model_len 8192) against graphs captured at caps 2 and 1. Each row takes
only the splits its own context fills (triton_decode._row_splits), so at 200 keys the
16-split graph should cost what a 2-split one does (docs/benchmarks.md, "Decode splits from
the step's contexts").

    PYTHONPATH=<project> python benchmarks/gpu/bench_decode_splits.py [--batches 1,8,32]
        [--contexts 200,2000] [--replays 200]
"""

from __future__ import annotations

import argparse
import random
import sys

import torch

from scheduler_worker.backends.cuda import CudaBackend
from scheduler_worker.backends.triton_decode import paged_decode_attention

H, HKV, D, BS, MAX_LEN, LAYERS = 32, 8, 64, 16, 8192, 16


def time_graph(fn, replays: int) -> float:
    """µs a layer: fn run LAYERS times, captured in one CUDA graph (warmed up first)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(LAYERS):
            fn()
    for _ in range(10):
        graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1000 / replays / LAYERS


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--contexts", default="200,2000")
    ap.add_argument("--replays", type=int, default=200)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 1
    backend = CudaBackend(
        torch.bfloat16, BS, num_kv_heads=HKV, max_num_seqs=256, max_num_batched_tokens=2048,
        max_model_len=MAX_LEN, gpu_memory_utilization=0.9, enforce_eager=False, head_dim=D,
    )  # fmt: skip
    dev = torch.device("cuda")
    batches = [int(x) for x in args.batches.split(",")]
    contexts = [int(x) for x in args.contexts.split(",")]
    blocks_per_row = -(-max(contexts) // BS)
    num_blocks = max(batches) * blocks_per_row + 1
    k_cache = torch.randn(num_blocks, BS, HKV, D, device=dev, dtype=torch.bfloat16)
    v_cache = torch.randn_like(k_cache)
    perm = list(range(num_blocks))
    random.Random(0).shuffle(perm)
    print(f"{torch.cuda.get_device_name()}: H {H}, Hkv {HKV}, D {D}, bf16, µs a layer")
    print(f"{'batch':>5} {'context':>7} {'cap':>4} {'at cap':>8} {'cap 2':>8} {'cap 1':>8}")
    for b in batches:
        cap = backend.splits(b)
        tables = torch.tensor(perm[: b * blocks_per_row], device=dev).view(b, -1).int()
        q = torch.randn(b, H, D, device=dev, dtype=torch.bfloat16)
        out = torch.empty_like(q)
        for ctx in contexts:
            lens = torch.full((b,), ctx, dtype=torch.int32, device=dev)

            def attend(s: int, q=q, tables=tables, lens=lens, out=out) -> None:
                paged_decode_attention(
                    q, k_cache, v_cache, tables, lens, D**-0.5, out=out, num_splits=s
                )

            times = [time_graph(lambda s=s: attend(s), args.replays) for s in (cap, 2, 1)]
            print(f"{b:>5} {ctx:>7} {cap:>4} " + " ".join(f"{t:>8.2f}" for t in times), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
