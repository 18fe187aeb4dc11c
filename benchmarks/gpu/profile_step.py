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
            for rid in list(eng.requests):
                eng.abort(rid)
            while eng.has_unfinished():
                eng.step()
    return 0


if __name__ == "__main__":
    sys.exit(main())
