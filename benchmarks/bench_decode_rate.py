"""Decode tokens/s of one model through the engine at batch 1 and 8, one thread, greedy:
a quick A/B of a change to the model's step (run it in each tree, alternating).

    PYTHONPATH=. python benchmarks/bench_decode_rate.py --model smollm2 --dtype float32

Prints one line: the tree, whether the one-call C++ decode step ran ("plan"), and the
rates.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from common.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from common.model_files.model_source import resolve_model
from common.sampling_params import SamplingParams
from scheduler_worker.engine import LLMEngine


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--quantization", default="auto")
    ap.add_argument("--tokens", type=int, default=64)
    args = ap.parse_args()
    torch.set_num_threads(1)
    model = ModelConfig(model=args.model, dtype=args.dtype, quantization=args.quantization)
    plain = SchedulerConfig(speculative_method="none")  # the model's step, no drafts
    cfg = EngineConfig(model=model, cache=CacheConfig(kv_cache_memory_gb=0.5), scheduler=plain)
    engine = LLMEngine(cfg, resolve_model(args.model))
    plan = getattr(engine.runner.model, "decode_plan", None) is not None
    engine.generate([[100, 200, 300]], SamplingParams(max_tokens=4, ignore_eos=True))
    params = SamplingParams(max_tokens=args.tokens, temperature=0.0, ignore_eos=True)
    rates = []
    for batch in (1, 8):
        prompts = [[100 + i, 200, 300, 400] for i in range(batch)]
        t0 = time.perf_counter()
        engine.generate(prompts, params)
        rates.append(batch * args.tokens / (time.perf_counter() - t0))
    tree = Path.cwd().name  # the tree it runs in
    print(tree, "plan" if plan else "per-op", f"tok/s b1 {rates[0]:.1f} b8 {rates[1]:.1f}")


if __name__ == "__main__":
    main()
