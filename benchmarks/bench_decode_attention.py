"""Decode attention microbenchmark: one decode step's paged attention over every layer of a
model shape, each layer its own cache (as in the engine, so the K/V come from memory, not
from a cache level), float32 against float16 caches (--kv-cache-dtype).

    python benchmarks/bench_decode_attention.py --rows 8,32 --context 192

Prints, per cache type and row count, ms per step and the K/V bytes read per second. The
default shape is SmolLM2-135M's (30 layers, 9 query heads, 3 KV heads, head size 64).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
if __package__ in (None, ""):
    sys.path.insert(0, str(REPO))

from benchmarks.bench_engine import machine_info  # noqa: E402
from scheduler_worker import kernels  # noqa: E402

DTYPES = {"float32": torch.float32, "float16": torch.float16}


def step_ms(rows: int, context: int, args: argparse.Namespace, cache: torch.dtype) -> float:
    """Median ms of one step (every layer once) over --repeats steps."""
    bs = args.block_size
    per_seq = -(-context // bs)
    g = torch.Generator().manual_seed(0)
    shape = (rows * per_seq + 1, bs, args.kv_heads, args.head_dim)
    layers = [
        (torch.randn(shape, generator=g).to(cache), torch.randn(shape, generator=g).to(cache))
        for _ in range(args.layers)
    ]
    # scattered blocks, as a pool that has served many requests hands them out
    tables = (torch.randperm(rows * per_seq, generator=g) + 1).view(rows, per_seq)
    lens = torch.full((rows,), context, dtype=torch.long)
    q = torch.randn(rows, args.heads, args.head_dim, generator=g)
    isa = kernels.isa_index(kernels.best_isa())
    op = torch.ops.zeroserve.paged_decode_attention
    scale = args.head_dim**-0.5
    times = []
    for _ in range(args.repeats + 1):
        t = time.perf_counter()
        for kc, vc in layers:
            op(q, kc, vc, tables, lens, scale, isa, 0)
        times.append(time.perf_counter() - t)
    times = sorted(times[1:])  # the first step warms up
    return times[len(times) // 2] * 1e3


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--rows", default="8,32", help="decode rows (sequences), comma-separated")
    p.add_argument("--context", type=int, default=192, help="tokens per sequence")
    p.add_argument("--layers", type=int, default=30)
    p.add_argument("--heads", type=int, default=9)
    p.add_argument("--kv-heads", type=int, default=3)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--cache-dtypes", default="float32,float16")
    args = p.parse_args()
    if not kernels.load():
        sys.exit("the C++ kernels are not built: python -m scheduler_worker.kernels")
    print(machine_info())
    print(
        f"{args.layers} layers, {args.heads} heads / {args.kv_heads} KV heads of "
        f"{args.head_dim}, context {args.context}, kernel path {kernels.best_isa()}"
    )
    for rows in (int(r) for r in args.rows.split(",")):
        base = None
        for name in args.cache_dtypes.split(","):
            dtype = DTYPES[name]
            ms = step_ms(rows, args.context, args, dtype)
            kv_bytes = 2 * args.layers * rows * args.context * args.kv_heads * args.head_dim
            kv_bytes *= torch.empty((), dtype=dtype).element_size()
            base = base or ms
            print(
                f"rows {rows:3d} cache {name:8s}: {ms:7.2f} ms/step  "
                f"{kv_bytes / ms / 1e6:6.1f} GB/s of K/V  ({base / ms:.2f}x the first)"
            )


if __name__ == "__main__":
    main()
