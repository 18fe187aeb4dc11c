"""The cost of structured outputs in the engine (issue 22's targets), per CPU kind.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/bench_structured.py [--streams 32] [--steps 64]

The default model in-process (its default quantized kernels). Two figures, each the
unconstrained run against the constrained one, alternated 3 times after a warm-up round
(best of 3):
  - 32 streams kept in flight (a finished request is replaced at once), half of them
    constrained by a realistic schema (an order: nested object, enum, pattern, array of
    objects, anyOf): output tok/s over `--steps` engine steps; target >= 0.9x.
  - 1 stream: time per output token (TPOT) over `--steps` decode steps, constrained vs
    free; target <= 1.05x.
Temperature 1 (seeded), a chat prompt asking for the order as JSON. Each line also says
how long the masks held the engine's step: their making, before the forward, where torch
has every core (the default); the wait after the forward where a thread overlaps it
(scheduler_worker/structured.py).
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import itertools
import json
import time

from tokenizers import Tokenizer

from benchmarks.bench_grammar import ORDER
from common.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from common.cpu import cpu_kind, cpu_model_name
from common.model_files.model_source import resolve_model
from common.sampling_params import SamplingParams
from scheduler_worker.engine import LLMEngine

STRUCTURED = {"kind": "json", "spec": json.dumps(ORDER)}
PROMPT = (
    "<|im_start|>user\nWrite a customer order (id, status, customer, items, note) as JSON."
    "<|im_end|>\n<|im_start|>assistant\n"
)


def run(
    engine: LLMEngine, prompt: list[int], streams: int, constrained: int, steps: int
) -> tuple[int, float, float]:
    """(output tokens, seconds, seconds the engine's steps spent on grammar masks: making
    them before the forward, or waiting for the mask thread after it where a core is spare) over `steps` steps with `streams` requests in flight, the first `constrained`
    of them constrained (and their replacements); prefill steps are excluded by warming up
    until every stream decodes, and so are the steps that prefill a replacement (the cost
    measured is the decode's, where the grammar masks are)."""
    ids = itertools.count()
    kind: dict[str, bool] = {}

    def add(structured: bool) -> None:
        rid = f"b{next(ids)}"
        kind[rid] = structured
        engine.add_request(
            rid,
            prompt,
            SamplingParams(
                max_tokens=256,
                temperature=1.0,
                seed=len(kind),
                ignore_eos=not structured,
                structured=STRUCTURED if structured else None,
            ),
        )

    for i in range(streams):
        add(i < constrained)

    def step() -> tuple[int, float]:
        n, t0 = 0, time.perf_counter()
        outs = engine.step()
        elapsed = time.perf_counter() - t0
        for out in outs:
            n += len(out.new_token_ids)
            if out.finish_reason is not None:
                add(kind[out.request_id])  # keep the mix in flight
        if engine.last_step.num_prefill_tokens:  # a replacement's prefill: not decode cost
            return 0, 0.0
        return n, elapsed

    for _ in range(4):  # the prefills
        step()
    tokens, elapsed = 0, 0.0
    engine.grammars.step_time = 0.0
    for _ in range(steps):
        n, dt = step()
        tokens, elapsed = tokens + n, elapsed + dt
    waited = engine.grammars.step_time
    for rid in list(engine.requests):
        engine.abort(rid)
    while engine.has_unfinished():
        engine.step()
    return tokens, elapsed, waited


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--streams", type=int, default=32)
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    model_dir = resolve_model("smollm2")
    engine = LLMEngine(
        EngineConfig(
            model=ModelConfig(model="smollm2"),
            cache=CacheConfig(num_blocks=4096),
            scheduler=SchedulerConfig(
                max_num_seqs=64, max_num_batched_tokens=4096, speculative_method="none"
            ),
        ),
        model_dir,
    )
    prompt = Tokenizer.from_file(str(model_dir / "tokenizer.json")).encode(PROMPT).ids
    print(f"CPU: {cpu_model_name()} ({cpu_kind()}); prompt {len(prompt)} tokens")
    best: dict[str, float] = {}
    waits: dict[str, float] = {}
    for repeat in range(args.repeats + 1):  # the first round warms up (KV pages, grammar)
        for label, streams, constrained in (
            ("many free", args.streams, 0),
            ("many half", args.streams, args.streams // 2),
            ("one free", 1, 0),
            ("one constrained", 1, 1),
        ):
            tokens, secs, waited = run(engine, prompt, streams, constrained, args.steps)
            rate = tokens / secs
            if repeat and rate > best.get(label, 0.0):
                best[label], waits[label] = rate, waited / args.steps
    free, half = best["many free"], best["many half"]
    mode = (
        "in a thread during the forward" if engine.grammars.overlap else "made before the forward"
    )
    print(
        f"{args.streams} streams: unconstrained {free:7.1f} tok/s, half constrained "
        f"{half:7.1f} tok/s: {half / free:.3f}x (target >= 0.9x); masks held the step "
        f"{waits['many half'] * 1e3:.3f} ms ({mode})"
    )
    tpot_free, tpot_c = 1e3 / best["one free"], 1e3 / best["one constrained"]
    print(
        f"1 stream TPOT: unconstrained {tpot_free:6.2f} ms, constrained {tpot_c:6.2f} ms: "
        f"{tpot_c / tpot_free:.3f}x (target <= 1.05x); masks held the step "
        f"{waits['one constrained'] * 1e3:.3f} ms"
    )


if __name__ == "__main__":
    main()
