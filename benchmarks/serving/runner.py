"""A whole run: the specs and their schedule, a warm-up, every request under the
concurrency limit, then the summary, time series and config as one result dict."""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import sys
import time
from datetime import UTC, datetime
from typing import Any

from benchmarks.serving.client import _Request, fetch_model, send_request
from benchmarks.serving.prompts import Spec, build_specs, load_tokenizer
from benchmarks.serving.schedule import arrival_offsets
from benchmarks.serving.stats import peak_concurrency, summarize, token_time_series
from benchmarks.serving.submit import http_client, submit_all
from benchmarks.serving.workers import run_in_processes


def resolve_client_processes(
    requested: int, num_prompts: int, max_concurrency: int | None, cpu_count: int | None = None
) -> int:
    """How many client processes a run uses (--client-processes; 0 = auto), never more than
    its concurrency (max_concurrency, or num_prompts without one). Auto: 1 below a
    concurrency of 16, else min(4, cpus // 2, concurrency // 8), at least 1."""
    concurrency = max(1, min(max_concurrency or num_prompts, num_prompts))
    if requested == 0:
        if concurrency < 16:
            return 1
        cpus = (os.cpu_count() or 1) if cpu_count is None else cpu_count
        requested = min(4, cpus // 2, concurrency // 8)
    return max(1, min(requested, concurrency))


async def run_benchmark(args: argparse.Namespace) -> dict[str, Any]:
    """Run the benchmark described by `args` (from `parse_args`) and return every figure,
    the per-request records and the time series."""
    check_args(args)
    tokenizer = load_tokenizer(args.tokenizer) if args.tokenizer else None
    specs = build_specs(args, tokenizer)
    offsets = arrival_offsets(
        len(specs),
        args.request_rate,
        submit_interval_ms=args.submit_interval_ms,
        burstiness=args.burstiness,
        seed=args.seed + 1,
    )
    n_procs = resolve_client_processes(args.client_processes, len(specs), args.max_concurrency)
    url = args.base_url.rstrip("/") + args.endpoint
    async with http_client(args, len(specs), args.max_concurrency) as client:
        model = args.model or await fetch_model(client, args)
        for i in range(args.warmup_requests):  # not counted; fails fast on a wrong setup
            spec = specs[i % len(specs)]
            w = _Request(-1, Spec(spec.prompt, spec.prompt_len, min(spec.output_len, 16)), 0.0)
            await send_request(client, args, url, model, w, tokenizer)
            if w.error is not None:
                raise RuntimeError(f"warm-up request to {url} failed: {w.error}")

        bar = _progress(len(specs), args.disable_tqdm)
        reqs = [_Request(i, s, off) for i, (s, off) in enumerate(zip(specs, offsets))]
        if n_procs == 1:
            on_done = bar.update if bar is not None else None
            t0 = time.perf_counter()
            end = await submit_all(
                client, args, url, model, reqs, tokenizer, args.max_concurrency, t0, on_done
            )
            duration = end - t0
    if n_procs > 1:  # after the warm-up client is closed: see workers.py
        t0, duration = await asyncio.to_thread(
            run_in_processes, args, url, model, reqs, n_procs, bar
        )
    if bar is not None:
        bar.close()

    records = [r.record(t0) for r in reqs]
    itls = [x for r in reqs if r.error is None for x in r.itls()]
    result = summarize(records, duration, itls if args.stream else None)
    spans = [(r["sent_s"], r["end_s"]) for r in records if r["end_s"] is not None]
    result["max_concurrent_requests"] = peak_concurrency(spans)
    events = [e for r in reqs for e in r.events(t0)]
    result["time_series"] = token_time_series(events, duration, args.series_interval)
    series = result["time_series"]["output_tokens_per_s"]
    result["peak_output_throughput"] = max(series) if series else 0.0
    result["config"] = {
        "base_url": args.base_url,
        "endpoint": args.endpoint,
        "model": model,
        "stream": args.stream,
        "ignore_eos": args.ignore_eos,
        "dataset": args.dataset,
        "request_rate": args.request_rate,
        "burstiness": args.burstiness,
        "submit_interval_ms": args.submit_interval_ms,
        "max_concurrency": args.max_concurrency,
        "client_processes": n_procs,
        "label": args.label,
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    result["args"] = {**vars(args), "api_key": "***" if args.api_key else None}
    result["requests"] = records
    return result


def _progress(total: int, disable: bool):
    if disable:
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, desc="requests", unit="req", file=sys.stderr)


def check_args(args: argparse.Namespace) -> None:
    if args.num_prompts < 1:
        raise ValueError("--num-prompts must be >= 1")
    if args.input_len < 1 or args.output_len < 1:
        raise ValueError("--input-len and --output-len must be >= 1")
    if not 0 <= args.range_ratio < 1:
        raise ValueError("--range-ratio must be in [0, 1)")
    if args.submit_interval_ms is not None and not math.isinf(args.request_rate):
        raise ValueError("--submit-interval-ms and --request-rate are exclusive")
    if args.submit_interval_ms is not None and args.submit_interval_ms < 0:
        raise ValueError("--submit-interval-ms must be >= 0")
    if args.request_rate <= 0 or args.burstiness <= 0:
        raise ValueError("--request-rate and --burstiness must be > 0")
    if args.max_concurrency is not None and args.max_concurrency < 1:
        raise ValueError("--max-concurrency must be >= 1")
    if args.dataset == "jsonl" and not args.dataset_path:
        raise ValueError("--dataset jsonl needs --dataset-path")
    if args.series_interval <= 0:
        raise ValueError("--series-interval must be > 0")
    if args.client_processes < 0:
        raise ValueError("--client-processes must be >= 0 (0 = auto)")
