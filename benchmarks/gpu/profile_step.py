"""Where a zeroserve decode step's time goes on the device: torch.profiler over a few
in-process decode steps at each batch size, printing wall ms per step, device-busy ms per
step, kernels launched per step, and the top host ops by self time.

    PYTHONPATH=<project> python profile_step.py MODEL_DIR [--device cuda] [--batches 1,32]
        [--steps 5] [--threads 0,1] [-- launch.py flags ...]

The engine is configured from launch.py's own flags (common.cli), so its defaults are the
server's; `--threads 0` is torch's default thread count.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from common.cli import add_config_args, config_from_args
from common.sampling_params import SamplingParams
from scheduler_worker.engine import LLMEngine


def main() -> int:
    argv = sys.argv[1:]
    extra: list[str] = []
    if "--" in argv:
        k = argv.index("--")
        argv, extra = argv[:k], argv[k + 1 :]
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--batches", default="1,32")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--threads", default="0")
    ap.add_argument("--prompt-tokens", type=int, default=100)
    ap.add_argument(
        "--mixed", type=int, default=0,
        help="per batch, time this many steps that each admit one new prompt (synced), "
        "against as many synced decode steps",
    )  # fmt: skip
    ap.add_argument(
        "--cprofile", type=int, default=0,
        help="per batch, the host's Python over this many decode steps (cProfile, top 25)",
    )  # fmt: skip
    args = ap.parse_args(argv)
    dev = args.device
    cp = argparse.ArgumentParser()
    add_config_args(cp)
    flags = ["--model", args.model, "--device", dev, *extra]
    cfg = config_from_args(cp.parse_args(flags))
    t = time.perf_counter()
    eng = LLMEngine(cfg.engine, Path(args.model))
    print(f"engine up in {time.perf_counter() - t:.1f}s ({' '.join(flags)})", flush=True)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev == "cuda" else [])

    def sync() -> None:
        if dev == "cuda":
            torch.cuda.synchronize()

    def warm(batch: int, tag: str) -> None:
        rng = random.Random(batch)
        p = SamplingParams(max_tokens=10 * args.steps + 40, temperature=0.0, ignore_eos=True)
        for i in range(batch):
            ids = [rng.randrange(100, 1000) for _ in range(args.prompt_tokens)]
            eng.add_request(f"{tag}-{i}", ids, p)
        while any(r.num_output_tokens == 0 for r in eng.requests.values()):
            eng.step()
        for _ in range(3):
            eng.step()

    for threads in (int(x) for x in args.threads.split(",")):
        if threads:
            torch.set_num_threads(threads)
        for batch in (int(x) for x in args.batches.split(",")):
            warm(batch, f"t{threads}b{batch}")
            sync()
            t0 = time.perf_counter()
            for _ in range(args.steps):
                eng.step()
            sync()
            plain = (time.perf_counter() - t0) / args.steps * 1000
            t0 = time.perf_counter()
            with profile(activities=acts) as prof:
                for _ in range(args.steps):
                    eng.step()
                sync()
            wall = (time.perf_counter() - t0) / args.steps * 1000
            ev = prof.key_averages()
            dev_us = sum(e.self_device_time_total for e in ev) if dev == "cuda" else 0
            kernels = (
                sum(e.count for e in ev if e.self_device_time_total > 0) if dev == "cuda" else 0
            )
            print(
                f"\n=== threads={threads or torch.get_num_threads()} batch={batch}: "
                f"wall {plain:.2f} ms/step unprofiled, {wall:.2f} profiled; device busy "
                f"{dev_us / args.steps / 1000:.2f} ms/step, {kernels / args.steps:.0f} "
                "kernels/step",
                flush=True,
            )
            print(ev.table(sort_by="self_cpu_time_total", row_limit=15, max_name_column_width=60))
            if dev == "cuda":  # the kernels by device time: attention's splits and merge
                print(ev.table(sort_by="self_device_time_total", row_limit=12,
                               max_name_column_width=60))  # fmt: skip
            if args.mixed:
                mixed_steps(eng, batch, args, sync)
            if args.cprofile:
                host_profile(eng, args.cprofile)
            for rid in list(eng.requests):
                eng.abort(rid)
            while eng.has_unfinished():
                eng.step()
    return 0


def mixed_steps(eng: LLMEngine, batch: int, args, sync) -> None:
    """A step that admits one new prompt beside `batch` decodes (eager: graphs hold decode
    steps only) against a decode step of the same batch, each synced on its own."""
    rng = random.Random(7)
    p = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)

    def timed() -> float:
        sync()
        t0 = time.perf_counter()
        eng.step()
        sync()
        return (time.perf_counter() - t0) * 1000

    dec, mix = [], []
    for k in range(args.mixed):
        dec.append(timed())
        ids = [rng.randrange(100, 1000) for _ in range(args.prompt_tokens)]
        eng.add_request(f"mix-{batch}-{k}", ids, p)
        mix.append(timed())
        for _ in range(2):  # the overlapped step in flight resolves; the newcomer decodes
            eng.step()
        eng.abort(f"mix-{batch}-{k}")
        eng.step()
    med = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
    print(
        f"=== batch={batch} synced steps: decode median {med(dec):.2f} ms "
        f"({' '.join(f'{x:.2f}' for x in dec)}); with one new {args.prompt_tokens}-token "
        f"prompt median {med(mix):.2f} ms ({' '.join(f'{x:.2f}' for x in mix)})",
        flush=True,
    )


def host_profile(eng: LLMEngine, steps: int) -> None:
    import cProfile
    import io
    import pstats

    pr = cProfile.Profile()
    pr.enable()
    for _ in range(steps):
        eng.step()
    pr.disable()
    buf = io.StringIO()
    pstats.Stats(pr, stream=buf).sort_stats("tottime").print_stats(25)
    print(f"=== cProfile, {steps} decode steps (tottime):", flush=True)
    print("\n".join(buf.getvalue().splitlines()[:45]), flush=True)


if __name__ == "__main__":
    sys.exit(main())
