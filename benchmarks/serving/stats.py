"""The figures of a run from its per-request records: percentiles, latency stats,
throughput and the output tokens/s time series."""

from __future__ import annotations

import math
from collections import Counter
from typing import Any


def percentile(values: list[float], p: float) -> float:
    """The p-th percentile (0..100) with linear interpolation, like numpy's default."""
    if not values:
        raise ValueError("percentile of no values")
    v = sorted(values)
    k = (len(v) - 1) * p / 100.0
    lo = math.floor(k)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)


def latency_stats(values_s: list[float]) -> dict[str, float | None]:
    """mean/median/p90/p99/min/max in milliseconds of values in seconds; None when empty."""
    keys = ("mean", "median", "p90", "p99", "min", "max")
    if not values_s:
        return dict.fromkeys(keys)
    ms = [x * 1000.0 for x in values_s]
    return {
        "mean": sum(ms) / len(ms),
        "median": percentile(ms, 50),
        "p90": percentile(ms, 90),
        "p99": percentile(ms, 99),
        "min": min(ms),
        "max": max(ms),
    }


def token_time_series(
    events: list[tuple[float, float]], duration_s: float, interval_s: float = 1.0
) -> dict[str, Any]:
    """Output tokens per second in bins of interval_s from events (time after start, tokens).
    t_s are the bins' starts; the last bin ends at duration_s (its rate uses its own width)."""
    n_bins = max(1, math.ceil(duration_s / interval_s - 1e-9))
    bins = [0.0] * n_bins
    for t, tokens in events:
        bins[min(max(int(t / interval_s), 0), n_bins - 1)] += tokens
    starts = [i * interval_s for i in range(n_bins)]
    widths = [interval_s] * n_bins
    widths[-1] = max(duration_s - starts[-1], 1e-3 * interval_s) if duration_s > 0 else interval_s
    return {
        "t_s": starts,
        "end_s": max(duration_s, starts[-1] + widths[-1]),
        "output_tokens_per_s": [b / w for b, w in zip(bins, widths)],
    }


def peak_concurrency(intervals: list[tuple[float, float]]) -> int:
    """The most intervals (start, end) open at once."""
    points = sorted(
        [(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals], key=lambda x: (x[0], x[1])
    )
    cur = peak = 0
    for _, d in points:
        cur += d
        peak = max(peak, cur)
    return peak


def summarize(
    records: list[dict[str, Any]], duration_s: float, itls_s: list[float] | None = None
) -> dict[str, Any]:
    """The result figures from per-request records (see `_Request.record`)."""
    ok = [r for r in records if r["success"]]
    failed = [r for r in records if not r["success"]]
    out_tokens = sum(r["output_tokens"] or 0 for r in ok)
    in_tokens = sum(_input_tokens(r) for r in ok)
    duration = max(duration_s, 1e-9)
    res: dict[str, Any] = {
        "num_requests": len(records),
        "completed": len(ok),
        "failed": len(failed),
        "duration_s": duration_s,
        "total_input_tokens": in_tokens,
        "total_output_tokens": out_tokens,
        "request_throughput": len(ok) / duration,
        "output_throughput": out_tokens / duration,
        "total_token_throughput": (in_tokens + out_tokens) / duration,
        "input_tokens_from_server": all(r["prompt_tokens"] is not None for r in ok),
    }
    groups = {
        "ttft": [r["ttft_s"] for r in ok if r["ttft_s"] is not None],
        "tpot": [r["tpot_s"] for r in ok if r["tpot_s"] is not None],
        "itl": list(itls_s or []),
        "e2el": [r["e2e_s"] for r in ok if r["e2e_s"] is not None],
    }
    for name, vals in groups.items():
        for k, v in latency_stats(vals).items():
            res[f"{k}_{name}_ms"] = v
    errors = Counter(r["error"] for r in failed)
    res["errors"] = [{"error": e, "count": c} for e, c in errors.most_common()]
    return res


def _input_tokens(r: dict[str, Any]) -> int:
    if r["prompt_tokens"] is not None:  # what the server counted (template, BOS included)
        return r["prompt_tokens"]
    return r["prompt_len"] or 0
