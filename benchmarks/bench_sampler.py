"""The sampler: the torch path against the draw op, in the same run, alternated, on the
issue 52 chat mix. On the CPU the op is the C++ one (scheduler_worker/draws.py,
kernels/csrc/sample_rows.cpp); with --device cuda the GPU backend's Triton launch
(backends/triton_sample.py), timed by the wall clock to the tokens on the host, and the
host's time to enqueue the call (what a step's host pays, the device's work aside).

    .venv/bin/python benchmarks/bench_sampler.py [--rows 32 256] [--vocab 49152 128256] [--threads 1 2]
    python benchmarks/bench_sampler.py --device cuda [--rows 32 256] [--vocab 49152 128256]

Rows: benchmarks/bench_top_p.py's "chat" logits (their nuclei match SmolLM2-135M's on real
text); parameters as the chat mix sends them (bench_serving.py --mix chat, without its
grammar rows): a quarter greedy, the rest temperature 0.7 and top_p 0.9, a quarter with a
seed, one in eight with logprobs 5, one in eight with presence_penalty 0.5 (bench_host_step.chat_mix). Each call is
`Sampler.sample(...).result()` on the step's own (writable) logits, as the engine makes it.
Prints ms a call (min / median of --repeat; the thread's CPU time at one thread, the wall
clock at more), µs a row, the ratio, and how
many seeded rows drew another token than the torch path (the op's near-ties; a seeded row's
uniforms are the same on both paths).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_host_step import chat_mix  # noqa: E402
from benchmarks.bench_top_p import make_rows  # noqa: E402
from scheduler_worker import kernels  # noqa: E402
from scheduler_worker.sampling import Sampler, SamplingRow  # noqa: E402


def chat_rows(n: int) -> list[SamplingRow]:
    """The chat mix's rows (bench_host_step.chat_mix, no grammar), each with a prompt and
    20 output tokens (what penalties count) and a slot (the sampler's kept columns)."""
    return [
        SamplingRow(
            chat_mix(i, grammar=False),
            list(range(30)),
            [(i * 7 + j) % 500 for j in range(20)],
            slot=i,
        )
        for i in range(n)
    ]


def timed(sampler: Sampler, logits: torch.Tensor, rows, repeat: int) -> tuple[float, float, list]:
    # one thread: its CPU time (load-free); more, or a GPU: the wall clock
    on_cpu = logits.device.type == "cpu"
    clock = time.thread_time if torch.get_num_threads() == 1 and on_cpu else time.perf_counter
    times, tokens = [], []
    for _ in range(repeat):
        step = logits.clone()
        if not on_cpu:
            torch.cuda.synchronize()
        t0 = clock()
        tokens = sampler.sample(step, rows, writable=True).result().token_ids
        times.append(clock() - t0)
    return min(times) * 1e3, statistics.median(times) * 1e3, tokens


def pair(paths: dict, logits: torch.Tensor, rows, args: argparse.Namespace) -> tuple:
    """The torch path's and the op's timed() in turn, and how many seeded rows drew
    differently (near-ties: the uniforms are the same)."""
    res = {k: timed(s, logits, rows, args.repeat) for k, s in paths.items()}
    seeded = [i for i, r in enumerate(rows) if r.params.seed is not None]
    differ = sum(res["torch"][2][i] != res["op"][2][i] for i in seeded)
    return res["torch"], res["op"], f"{differ} of {len(seeded)}"


def enqueue_ms(sampler: Sampler, logits: torch.Tensor, rows, repeat: int) -> float:
    """A GPU's host time to enqueue a call (the median, ms): Sampler.sample returns before
    the device is done, so this is the host's share of a step's sampling."""
    times = []
    for _ in range(repeat):
        step = logits.clone()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        sample = sampler.sample(step, rows, writable=True).start_copy()
        times.append(time.perf_counter() - t0)
        sample.result()
    return statistics.median(times) * 1e3


def main_cuda(args: argparse.Namespace) -> None:
    """--device cuda: the torch path against the Triton launch (the GPU backend's draw_rows)."""
    from scheduler_worker.backends.base import DrawRows
    from scheduler_worker.backends.triton_sample import sample_rows_keyed

    print(f"{torch.cuda.get_device_name()}; torch {torch.__version__}; clock: wall")
    for vocab in args.vocab:
        for n in args.rows:
            logits, _ = make_rows("chat", n, vocab, "cuda")
            rows = chat_rows(n)
            # as CudaBackend declares it (on the logits' device: a CPU where a test runs it)
            keyed = DrawRows(sample_rows_keyed, keyed=True, device=logits.device.type)
            paths = {"torch": Sampler(vocab, [2]), "op": Sampler(vocab, [2], None, keyed)}
            assert paths["op"].draw_op(logits.device) is keyed  # the op, not the torch path
            for s in paths.values():  # compiles, lazy state
                timed(s, logits, rows, 2)
            for _ in range(args.rounds):
                (t_min, t_med, _), (o_min, o_med, _), differ = pair(paths, logits, rows, args)
                host = {k: enqueue_ms(s, logits, rows, args.repeat) for k, s in paths.items()}
                print(
                    f"cuda vocab {vocab} rows {n}: to the host torch {t_min:.3f} / {t_med:.3f} ms, "
                    f"op {o_min:.3f} / {o_med:.3f} ms: {t_med / o_med:.1f}x; host enqueue torch "
                    f"{host['torch']:.3f} ms, op {host['op']:.3f} ms; seeded rows differing "
                    f"{differ}",
                    flush=True,
                )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--rows", type=int, nargs="+", default=[32, 256])
    ap.add_argument("--vocab", type=int, nargs="+", default=[49152, 128256])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=2, help="torch / op pairs, alternated")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    args = ap.parse_args()
    if args.device == "cuda":
        return main_cuda(args)
    if not kernels.load():
        sys.exit("the C++ kernels are not built here: `python -m scheduler_worker.kernels`")
    isa = kernels.isa_index(kernels.best_isa())
    print(
        f"kernels isa {kernels.best_isa()}; torch {torch.__version__}; clock: thread CPU at 1 thread, else wall"
    )
    for threads in args.threads:
        torch.set_num_threads(threads)
        for vocab in args.vocab:
            for n in args.rows:
                logits, _ = make_rows("chat", n, vocab, "cpu")
                rows = chat_rows(n)
                paths = {"torch": Sampler(vocab, [2]), "op": Sampler(vocab, [2], isa)}
                for _ in range(args.rounds):
                    (t_min, t_med, _), (o_min, o_med, _), differ = pair(paths, logits, rows, args)
                    print(
                        f"threads {threads} vocab {vocab} rows {n}: torch {t_min:.2f} / "
                        f"{t_med:.2f} ms ({t_med / n * 1e3:.0f} us a row), op {o_min:.2f} / "
                        f"{o_med:.2f} ms ({o_med / n * 1e3:.0f} us a row): {t_med / o_med:.1f}x; "
                        f"seeded rows differing {differ}",
                        flush=True,
                    )


if __name__ == "__main__":
    main()
