"""Tensor parallelism on the CPU: tp=2 against tp=1, in one run, at 1 and N streams.

    python benchmarks/bench_tp.py --model smollm2 --engines 1x2,1x1,2x1 --streams 1,32 \
        --input-len 64 --output-len 64 --json bench_results/tp.json

Each engine is in process (this process is rank 0 of each; tp=2 starts a rank 1), the
runs of the engines alternated over --rounds and their medians reported; float32, the
float path (a GGUF's matrices dequantized: what tensor parallelism serves today), the
same prompts, greedy, ignore_eos. Per run: output tok/s and, per engine step, the step
broadcast's count and time (rank 0's side: encoding and the broadcast), the model's
collectives (all-reduces, the head's gather) and their time on rank 0. Each engine's torch
threads a rank are given (1x2: one process on two threads; 2x1: two ranks on one each,
what --tp 2 gives on two cores). On two cores tp=2 is not expected to win: the figures say
what it costs (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import time
from pathlib import Path

import torch

from common.config import CacheConfig, Config, EngineConfig, ModelConfig, SchedulerConfig
from common.cpu import cpu_kind_label, cpu_model_name
from common.model_files.model_source import resolve_model
from common.sampling_params import SamplingParams
from scheduler_worker.engine import LLMEngine
from scheduler_worker.parallel.ranks import start_ranks


def run_one(engine: LLMEngine, prompts: list[list[int]], output_len: int) -> dict:
    runner = engine.runner
    group, channel = runner.tp, runner.channel
    params = SamplingParams(max_tokens=output_len, temperature=0.0, ignore_eos=True)
    before = (
        engine.counters.num_steps,
        channel.broadcasts if channel else 0,
        channel.send_s if channel else 0.0,
        group.all_reduces if group else 0,
        group.reduce_s if group else 0.0,
    )
    t0 = time.perf_counter()
    outs = engine.generate(prompts, params)
    elapsed = time.perf_counter() - t0
    after = (
        engine.counters.num_steps,
        channel.broadcasts if channel else 0,
        channel.send_s if channel else 0.0,
        group.all_reduces if group else 0,
        group.reduce_s if group else 0.0,
    )
    steps, bcasts, send_s, reduces, reduce_s = (a - b for a, b in zip(after, before))
    n_out = sum(map(len, outs))
    return {
        "streams": len(prompts),
        "seconds": elapsed,
        "output_tokens": n_out,
        "tokens_per_s": n_out / elapsed,
        "steps": steps,
        "ms_per_step": 1000 * elapsed / steps,
        "broadcasts_per_step": bcasts / steps,
        "broadcast_us_per_step": 1e6 * send_s / steps,
        "collectives_per_step": reduces / steps,  # all-reduces (the gather not counted)
        "collective_ms_per_step": 1000 * reduce_s / steps,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", default="smollm2")
    ap.add_argument(
        "--engines",
        default="1x2,1x1,2x1",
        help="TPxTHREADS each: tp ranks, torch threads a rank (1x2: one process on 2 threads)",
    )
    ap.add_argument("--streams", default="1,32")
    ap.add_argument("--input-len", type=int, default=64)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3, help="runs of each, alternated; medians")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    model_dir = resolve_model(a.model)
    rng = random.Random(0)
    streams = [int(s) for s in a.streams.split(",")]
    prompts = [[rng.randrange(100, 40000) for _ in range(a.input_len)] for _ in range(max(streams))]
    cores = len(os.sched_getaffinity(0))
    # every engine lives through the whole run (tp=1 ones first: no group exists yet), so
    # that their runs alternate and a noisy machine's drift falls on both alike
    specs = [tuple(int(v) for v in e.split("x")) for e in a.engines.split(",")]
    engines: dict[str, tuple[LLMEngine, int]] = {}
    ranks = []
    try:  # tp=1 engines first: they must be built while no group exists
        for tp, threads in sorted(specs, key=lambda e: e[0]):
            config = EngineConfig(
                model=ModelConfig(
                    model=str(model_dir),
                    dtype="float32",
                    quantization="none",
                    tensor_parallel_size=tp,
                    num_threads=threads,
                    collective_timeout_s=3600.0,  # a follower waits while the others run
                ),
                cache=CacheConfig(kv_cache_memory_gb=0.5),
                # tp against tp=1 on the plain decode step
                scheduler=SchedulerConfig(max_num_seqs=max(streams), speculative_method="none"),
            )
            r = start_ranks(Config(engine=config))
            ranks += [r] if r is not None else []
            engines[f"{tp}x{threads}"] = (LLMEngine(config, model_dir), threads)
        runs: dict[tuple[str, int], list[dict]] = {}
        for _ in range(a.rounds):
            for name, (engine, threads) in engines.items():
                torch.set_num_threads(threads)  # this process's: each engine's rank 0
                engine.generate([prompts[0]], SamplingParams(max_tokens=2, ignore_eos=True))
                for n in streams:
                    got = run_one(engine, prompts[:n], a.output_len)
                    runs.setdefault((name, n), []).append(got)
    finally:
        for r in ranks:
            r.stop()
    results = []
    for (name, n), got in runs.items():
        med = {k: statistics.median(g[k] for g in got) for k in got[0]}
        results.append({"engine": name, **med, "runs": got})
        print(
            f"tp x threads {name} streams={n:3d}: {med['tokens_per_s']:7.1f} tok/s, "
            f"{med['ms_per_step']:6.1f} ms/step; a step: "
            f"{med['broadcasts_per_step']:.2f} broadcasts {med['broadcast_us_per_step']:6.0f} µs, "
            f"{med['collectives_per_step']:.0f} all-reduces + 1 gather "
            f"{med['collective_ms_per_step']:.1f} ms (medians of {len(got)})",
            flush=True,
        )
    cpu = f"{cpu_model_name()} ({cpu_kind_label()}), {cores} cores, load {os.getloadavg()[0]:.1f}"
    print(f"CPU: {cpu}")
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        out = {"cpu": cpu, "args": {**vars(a), "json": str(a.json)}, "results": results}
        a.json.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
