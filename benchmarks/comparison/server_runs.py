"""bench_serving's runs against a running server (rows b, c and e): warm-up, the main
load with the busy split, and the one-at-a-time TTFT, paired or not."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from typing import Any

from benchmarks import bench_serving
from benchmarks.comparison.metrics import busy_delta, counter_delta
from benchmarks.comparison.process import Process, wait_idle
from benchmarks.comparison.row_offline import PairedPrefill
from benchmarks.comparison.util import median
from benchmarks.comparison.workload import Workload


def bench(
    args: argparse.Namespace,
    base_url: str,
    jsonl: Path,
    n: int,
    output_len: int,
    concurrency: int,
    label: str,
    tokenizer_dir: Path,
) -> dict[str, Any]:
    """One bench_serving run, in process, every request submitted at once."""
    argv = [
        "--base-url",
        base_url,
        "--dataset",
        "jsonl",
        "--dataset-path",
        str(jsonl),
        "--num-prompts",
        str(n),
        "--output-len",
        str(output_len),
        "--max-concurrency",
        str(concurrency),
        "--warmup-requests",
        "0",
        "--tokenizer",
        str(tokenizer_dir),
        "--seed",
        str(args.seed),
        "--timeout",
        str(args.request_timeout),
        "--label",
        label,
        "--disable-tqdm",
    ]
    res = asyncio.run(bench_serving.run_benchmark(bench_serving.parse_args(argv)))
    if res["completed"] == 0:
        raise RuntimeError(f"{label}: every request failed: {res['errors'][:3]}")
    return res


def serving_summary(res: dict[str, Any], expected_tokens: int) -> dict[str, Any]:
    keys = (
        "completed",
        "failed",
        "duration_s",
        "total_input_tokens",
        "total_output_tokens",
        "output_throughput",
        "median_ttft_ms",
        "mean_ttft_ms",
        "p90_ttft_ms",
        "median_tpot_ms",
        "mean_tpot_ms",
        "median_itl_ms",
        "median_e2el_ms",
        "errors",
    )
    out = {k: res.get(k) for k in keys}
    out["expected_output_tokens"] = expected_tokens
    return out


def _warn_if_short(row: dict[str, Any], name: str, res: dict[str, Any], expected: int) -> None:
    if res["failed"]:
        row["warnings"].append(
            f"{name}: {res['failed']} of {res['num_requests']} requests failed: {res['errors'][:2]}"
        )
    if res["total_output_tokens"] != expected:
        row["warnings"].append(
            f"{name}: {res['total_output_tokens']} output tokens, expected "
            f"{expected} (ignore_eos not honoured?)"
        )


def paired_ttft(
    args: argparse.Namespace,
    w: Workload,
    paired: PairedPrefill,
    base_url: str,
    tmp: Path,
    name: str,
    model_dir: Path,
) -> dict[str, Any]:
    """The one-at-a-time run, paired: for each prompt, an in-process prefill of it, then
    the server's TTFT for it (bench_serving, one request)."""
    pre, ttft, results = [], [], []
    for i, (text, ids) in enumerate(zip(w.single_texts, w.single_ids)):
        pre.append(paired.prefill_ms(ids))
        one = w.write_jsonl(tmp / f"{name}-single-{i}.jsonl", [text], w.single_output_len)
        res = bench(
            args, base_url, one, 1, w.single_output_len, 1, f"{name} one at a time {i}", model_dir
        )
        results.append(res)
        ttft.append(res["median_ttft_ms"])
    over = [t - p for t, p in zip(ttft, pre)]
    return {
        "prefill_ms": pre,
        "ttft_ms": ttft,
        "overhead_ms": over,
        "median_overhead_ms": median(over),
        "median_prefill_ms": median(pre),
        "median_ttft_ms": median(ttft),
        "results": results,
    }


def serving_runs(
    args: argparse.Namespace,
    w: Workload,
    proc: Process,
    tmp: Path,
    name: str,
    model_dir: Path,
    metrics: bool,
    paired: PairedPrefill | None = None,
) -> dict[str, Any]:
    """Warm-up, main load (with the busy split when `metrics`), one at a time, and the
    paired TTFT when `paired` is given."""
    row: dict[str, Any] = {"warnings": []}
    warm = w.write_jsonl(tmp / f"{name}-warmup.jsonl", [w.warmup_text], 16)
    main = w.write_jsonl(tmp / f"{name}-main.jsonl", w.main_texts, w.output_len)
    bench(args, proc.base_url, warm, 1, 16, 1, f"{name} warm-up", model_dir)
    before = wait_idle(proc) if metrics else None
    n = len(w.main_texts)
    res = bench(
        args, proc.base_url, main, n, w.output_len, args.concurrency, f"{name} main", model_dir
    )
    expected = n * w.output_len
    row["main"] = serving_summary(res, expected)
    row["main_full"] = res
    _warn_if_short(row, "main load", res, expected)
    if metrics:
        after = wait_idle(proc)
        row["busy"] = busy_delta(before, after)
        row["forward_share"] = row["busy"]["forward_share"]
        row["metrics_delta"] = counter_delta(before, after)
    prompt_tokens = [r["prompt_tokens"] for r in res["requests"] if r["success"]]
    local = [len(x) for x in w.main_ids]
    if metrics and prompt_tokens and sorted(prompt_tokens) != sorted(local):
        row["warnings"].append(
            "the server counted other prompt lengths than the local "
            "tokenizer (the offline row saw different token ids)"
        )
    row["output_tok_s"] = res["output_throughput"]
    row["tpot_median_ms"] = res["median_tpot_ms"]
    if w.single_texts:
        k = len(w.single_texts)
        if paired is None:
            single = w.write_jsonl(
                tmp / f"{name}-single.jsonl", w.single_texts, w.single_output_len
            )
            res1 = bench(
                args,
                proc.base_url,
                single,
                k,
                w.single_output_len,
                1,
                f"{name} one at a time",
                model_dir,
            )
            row["single"] = serving_summary(res1, k * w.single_output_len)
            row["single_full"] = res1
            row["ttft_p50_ms"] = res1["median_ttft_ms"]
            _warn_if_short(row, "one at a time", res1, k * w.single_output_len)
        else:
            pt = row["paired_ttft"] = paired_ttft(
                args, w, paired, proc.base_url, tmp, name, model_dir
            )
            row["ttft_p50_ms"] = pt["median_ttft_ms"]
            row["single_full"] = pt.pop("results")
            row["single"] = {
                "completed": sum(r["completed"] for r in row["single_full"]),
                "failed": sum(r["failed"] for r in row["single_full"]),
                "total_output_tokens": sum(r["total_output_tokens"] for r in row["single_full"]),
                "median_ttft_ms": pt["median_ttft_ms"],
                "expected_output_tokens": k * w.single_output_len,
            }
            for i, res1 in enumerate(row["single_full"]):
                _warn_if_short(row, f"one at a time, prompt {i}", res1, w.single_output_len)
        if metrics:
            d = row["single_metrics_delta"] = counter_delta(after, wait_idle(proc))
            if d["zeroserve:prefix_cache_hits_total"]:
                row["warnings"].append(
                    f"one at a time: {d['zeroserve:prefix_cache_hits_total']:.0f}"
                    " prompt tokens came from the prefix cache"
                )
    return row
