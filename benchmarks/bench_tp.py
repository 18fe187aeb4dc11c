"""Tensor parallelism on the CPU: tp=2 against tp=1, in one run, at 1 and N streams.

    python benchmarks/bench_tp.py --model smollm2 --tp 1,2 --streams 1,32 \
        --input-len 64 --output-len 64 --json bench_results/tp.json

Each engine is in process (this process is rank 0; tp=2 starts rank 1), float32, the
float path (a GGUF's matrices dequantized: what tensor parallelism serves today), the
same prompts, greedy, ignore_eos. Per run: output tok/s and, per engine step, the step
broadcast's count and time (rank 0's side: encoding and the broadcast), the model's
collectives (all-reduces, the head's gather) and their time on rank 0. Threads: tp=1 gets
every core, each tp=2 rank cores // 2 (parallel/ranks.py). On two cores tp=2 is not
expected to win: the figures say what it costs (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

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
    ap.add_argument("--tp", default="1,2")
    ap.add_argument("--streams", default="1,32")
    ap.add_argument("--input-len", type=int, default=64)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    model_dir = resolve_model(a.model)
    rng = random.Random(0)
    widest = max(int(s) for s in a.streams.split(","))
    prompts = [[rng.randrange(100, 40000) for _ in range(a.input_len)] for _ in range(widest)]
    results = []
    for tp in (int(t) for t in a.tp.split(",")):
        config = EngineConfig(
            model=ModelConfig(
                model=str(model_dir), dtype="float32", quantization="none", tensor_parallel_size=tp
            ),
            cache=CacheConfig(kv_cache_memory_gb=0.5),
            scheduler=SchedulerConfig(max_num_seqs=widest),
        )
        ranks = start_ranks(Config(engine=config))
        try:
            engine = LLMEngine(config, model_dir)
            engine.generate([prompts[0]], SamplingParams(max_tokens=4, ignore_eos=True))  # warm
            for n in (int(s) for s in a.streams.split(",")):
                r = {"tp": tp, **run_one(engine, prompts[:n], a.output_len)}
                results.append(r)
                print(
                    f"tp={tp} streams={n:3d}: {r['tokens_per_s']:7.1f} tok/s, "
                    f"{r['ms_per_step']:6.1f} ms/step; a step: "
                    f"{r['broadcasts_per_step']:.2f} broadcasts {r['broadcast_us_per_step']:6.0f} µs, "
                    f"{r['collectives_per_step']:.0f} all-reduces + 1 gather "
                    f"{r['collective_ms_per_step']:.1f} ms",
                    flush=True,
                )
        finally:
            if ranks is not None:
                ranks.stop()
    cpu = f"{cpu_model_name()} ({cpu_kind_label()})"
    print(f"CPU: {cpu}")
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(
            json.dumps(
                {"cpu": cpu, "args": vars(a) | {"json": str(a.json)}, "results": results}, indent=2
            )
        )


if __name__ == "__main__":
    main()
