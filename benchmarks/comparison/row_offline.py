"""Row (a): the offline engine in process, the upper bound; and the in-process prefill
kept for the servers' paired TTFT."""

from __future__ import annotations

import argparse
import time
from collections import deque
from pathlib import Path
from typing import Any

from benchmarks.comparison.engine_args import engine_config
from benchmarks.comparison.util import mean, median
from benchmarks.comparison.workload import Workload


def offline_load(
    engine, prompts: list[list[int]], output_len: int, concurrency: int
) -> dict[str, Any]:
    """Closed loop like the client's: at most `concurrency` requests in the engine."""
    from common.sampling_params import SamplingParams

    params = SamplingParams(max_tokens=output_len, temperature=0.0, ignore_eos=True)
    pending = deque(enumerate(prompts))
    start: dict[str, float] = {}
    first: dict[str, float] = {}
    end: dict[str, float] = {}
    counts: dict[str, int] = {}
    busy0 = dict(engine.counters.busy_time)

    def admit() -> None:
        while pending and engine.num_unfinished < concurrency:
            i, p = pending.popleft()
            rid = f"cmp-{i}"
            start[rid] = time.perf_counter()
            counts[rid] = 0
            engine.add_request(rid, p, params)

    t0 = time.perf_counter()
    admit()
    while engine.has_unfinished() or pending:
        outs = engine.step()
        now = time.perf_counter()
        for o in outs:
            if o.request_id not in counts:
                continue
            if o.new_token_ids:
                counts[o.request_id] += len(o.new_token_ids)
                first.setdefault(o.request_id, now)
            if o.finish_reason is not None:
                end[o.request_id] = now
        admit()
    elapsed = time.perf_counter() - t0
    n_out = sum(counts.values())
    busy = {k: engine.counters.busy_time[k] - busy0[k] for k in busy0}
    total = sum(busy.values())
    ttft = [first[r] - start[r] for r in first]
    tpot = [(end[r] - first[r]) / (counts[r] - 1) for r in end if counts[r] > 1 and r in first]
    return {
        "seconds": elapsed,
        "output_tokens": n_out,
        "expected_output_tokens": len(prompts) * output_len,
        "output_throughput": n_out / elapsed,
        "busy_seconds": busy,
        "forward_share": busy["forward"] / total if total else None,
        "median_ttft_ms": 1e3 * median(ttft) if ttft else None,
        "median_tpot_ms": 1e3 * median(tpot) if tpot else None,
    }


def prefill_times(engine, prompts: list[list[int]]) -> dict[str, Any]:
    """add_request -> first token of one request at a time on an idle engine."""
    from common.sampling_params import SamplingParams

    params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    times, cached = [], []
    for i, p in enumerate(prompts):
        rid = f"prefill-{i}"
        t0 = time.perf_counter()
        engine.add_request(rid, p, params)
        got = None
        while got is None:
            for o in engine.step():
                if o.request_id == rid and o.new_token_ids:
                    got = time.perf_counter() - t0
                    cached.append(o.num_cached_tokens)
        times.append(got)
        while engine.has_unfinished():
            engine.step()
    ms = [t * 1e3 for t in times]
    return {
        "mean_ms": mean(ms),
        "median_ms": median(ms),
        "min_ms": min(ms),
        "max_ms": max(ms),
        "runs": len(ms),
        "num_cached_tokens": cached,
    }


class PairedPrefill:
    """An in-process engine for paired TTFT: this VM's speed drifts by 2x over minutes
    (docs/benchmarks.md), so the one-at-a-time check compares each server request with an
    in-process prefill of the same prompt run just before it, not with row (a)'s prefill
    measured minutes earlier. Prefix caching is off so a prompt can be prefilled again."""

    def __init__(self, args: argparse.Namespace, model_dir: Path) -> None:
        from dataclasses import replace

        from common.sampling_params import SamplingParams
        from scheduler_worker.engine import LLMEngine

        cfg = engine_config(args)
        cfg = replace(
            cfg,
            cache=replace(
                cfg.cache, enable_prefix_caching=False, num_blocks=None, kv_cache_memory_gb=0.25
            ),
        )
        self.engine = LLMEngine(cfg, model_dir)
        self.engine.generate([[1, 2, 3, 4]], SamplingParams(max_tokens=4, ignore_eos=True))

    def prefill_ms(self, ids: list[int]) -> float:
        return prefill_times(self.engine, [ids])["mean_ms"]


def row_offline(args: argparse.Namespace, w: Workload, model_dir: Path) -> dict[str, Any]:
    from common.sampling_params import SamplingParams
    from scheduler_worker.engine import LLMEngine

    cfg = engine_config(args)
    engine = LLMEngine(cfg, model_dir)
    dtype = str(engine.runner.dtype).replace("torch.", "")
    engine.generate([w.warmup_ids], SamplingParams(max_tokens=16, ignore_eos=True))
    load = offline_load(engine, w.main_ids, w.output_len, args.concurrency)
    prefill = prefill_times(engine, w.single_ids) if w.single_ids else None
    row = {
        "dtype": dtype,
        "device": str(engine.runner.device),
        "max_num_seqs": cfg.scheduler.max_num_seqs,
        "main": load,
        "prefill": prefill,
        "output_tok_s": load["output_throughput"],
        "ttft_p50_ms": prefill["mean_ms"] if prefill else None,
        "tpot_median_ms": load["median_tpot_ms"],
        "forward_share": load["forward_share"],
        "warnings": [],
    }
    if load["output_tokens"] != load["expected_output_tokens"]:
        row["warnings"].append(
            f"{load['output_tokens']} output tokens, expected {load['expected_output_tokens']}"
        )
    if prefill and any(prefill["num_cached_tokens"]):
        row["warnings"].append(
            f"prefill prompts hit the prefix cache: {prefill['num_cached_tokens']}"
        )
    return row
