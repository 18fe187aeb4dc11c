"""A server's /metrics: Prometheus text parsed, and what changed over a run (the
scheduler's busy split, the token and prefix-cache counters)."""

from __future__ import annotations

import contextlib
import re
from typing import Any


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text -> {name{labels}: value} (comments skipped); a labelled series is
    also summed under its bare name when that has no sample of its own (the token counters
    are per replica: `zeroserve:generation_tokens_total{engine="0"}`)."""
    out: dict[str, float] = {}
    sums: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            with contextlib.suppress(ValueError):
                out[name] = float(value)
                if "{" in name:
                    bare = name.partition("{")[0]
                    sums[bare] = sums.get(bare, 0.0) + float(value)
    return {**sums, **out}


_BUSY_RE = re.compile(r'^zeroserve:scheduler_busy_seconds_total\{part="([^"]+)"\}$')


def busy_parts(metrics: dict[str, float]) -> dict[str, float]:
    out = {}
    for name, v in metrics.items():
        if m := _BUSY_RE.match(name):
            out[m.group(1)] = v
    return out


def busy_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, Any]:
    """The busy split of a run from /metrics read before and after it."""
    b0, b1 = busy_parts(before), busy_parts(after)
    delta = {p: b1.get(p, 0.0) - b0.get(p, 0.0) for p in sorted(set(b0) | set(b1))}
    total = sum(delta.values())
    shares = {p: (v / total if total > 0 else None) for p, v in delta.items()}
    return {
        "seconds": delta,
        "total_s": total,
        "shares": shares,
        "forward_share": shares.get("forward"),
    }


COUNTERS = (
    "zeroserve:prompt_tokens_total",
    "zeroserve:generation_tokens_total",
    "zeroserve:prefix_cache_hits_total",
    "zeroserve:prefix_cache_queries_total",
)


def counter_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {k: after.get(k, 0.0) - before.get(k, 0.0) for k in COUNTERS}
