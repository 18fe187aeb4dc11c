"""The host's cost of a step's penalties (logits_processors.apply_penalties): each row's
tokens indexed from its Python lists every step (the per-row path, the reference) against
the counts kept per slot on the device (penalty_counts.PenaltyCounts: only the step's new
tokens cross), in the same run, at the same rows.

A steady decode: one row in eight carries a penalty (presence 0.5; every other one also
repetition 1.1), every row's last token is the step in flight's (overlapped scheduling)
and resolves the next step, contexts half prompt, half output. The torch ops run on the
CPU, one thread: the wall clock holds the host's work and the device's together. At a
small vocabulary (--vocab 1024) the device's share is small and what is left is mostly the
host's (Python, the index building, torch's dispatch); at Llama 3's 128,256 both. (The
`meta` device, shapes only, is no host figure: its kernels are Python.)

    .venv/bin/python benchmarks/bench_penalties.py [--rows 32 256] [--contexts 200 2000]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common.sampling_params import SamplingParams  # noqa: E402
from scheduler_worker.batch_params import BatchParamsCache  # noqa: E402
from scheduler_worker.logits_processors import SamplingRow  # noqa: E402
from scheduler_worker.penalties import apply_penalties  # noqa: E402
from scheduler_worker.penalty_counts import PenaltyCounts  # noqa: E402

VOCAB = 128_256  # Llama 3's (--vocab)


def _rows(n: int, context: int, rng: random.Random, vocab: int) -> list[SamplingRow]:
    plain = SamplingParams(max_tokens=4096, temperature=0.7, top_p=0.9)
    rows = []
    for i in range(n):
        if i % 8:
            p = plain
        else:
            rep = 1.1 if i % 16 == 0 else 1.0
            p = SamplingParams(max_tokens=4096, presence_penalty=0.5, repetition_penalty=rep)
        prompt = [rng.randrange(vocab) for _ in range(context // 2)]
        outs = [rng.randrange(vocab) for _ in range(context - context // 2 - 1)] + [-1]
        rows.append(SamplingRow(p, prompt, outs, i, None, (), i))
    return rows


def _step(rows: list[SamplingRow], rng: random.Random, vocab: int) -> None:
    """The token in flight resolves; the next one flies."""
    for r in rows:
        outs = r.output_token_ids
        assert isinstance(outs, list)
        outs[-1] = rng.randrange(vocab)
        outs.append(-1)


def run(n: int, context: int, vocab: int, steps: int) -> tuple[float, float, float]:
    """Median µs a step: the per-row path, the kept counts; and the counts' first step
    (every penalized row joins: its prompt and outputs filled)."""
    rng = random.Random(n * context)
    rows = _rows(n, context, rng, vocab)
    logits = torch.randn(n, vocab, generator=torch.Generator().manual_seed(n))
    prev = torch.randint(0, vocab, (n,))
    bp = BatchParamsCache().get([r.params for r in rows], [r.slot for r in rows])
    pool = PenaltyCounts()
    t0 = time.perf_counter()
    apply_penalties(logits, rows, prev, bp.penalized, bp.values, pool)
    first = (time.perf_counter() - t0) * 1e6
    each, kept = [], []
    for _ in range(steps):
        _step(rows, rng, vocab)
        t0 = time.perf_counter()
        ref = apply_penalties(logits, rows, prev, bp.penalized, bp.values)
        t1 = time.perf_counter()
        got = apply_penalties(logits, rows, prev, bp.penalized, bp.values, pool)
        t2 = time.perf_counter()
        assert torch.equal(ref, got), "the kept counts differ from the per-row path"
        each.append((t1 - t0) * 1e6)
        kept.append((t2 - t1) * 1e6)
    return statistics.median(each), statistics.median(kept), first


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[32, 256])
    ap.add_argument("--contexts", type=int, nargs="+", default=[200, 2000])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--vocab", type=int, nargs="+", default=[1024, VOCAB])  # 128,256: slow
    args = ap.parse_args()
    torch.set_num_threads(1)
    print(f"1 row in 8 penalized, median µs a step of {args.steps}, CPU, 1 thread")
    print(
        f"{'vocab':>7} {'rows':>5} {'context':>8} {'per-row':>8} {'kept':>6} {'ratio':>6} "
        f"{'join':>7}"
    )
    for vocab in args.vocab:
        for n in args.rows:
            for context in args.contexts:
                each, kept, first = run(n, context, vocab, args.steps)
                print(
                    f"{vocab:>7} {n:>5} {context:>8} {each:>8.0f} {kept:>6.0f} "
                    f"{each / kept:>6.1f} {first:>7.0f}"
                )


if __name__ == "__main__":
    main()
