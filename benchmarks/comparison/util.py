"""Small helpers every part of the comparison uses: its log line, median and mean."""

from __future__ import annotations

import sys

from benchmarks import bench_serving


def log(msg: str) -> None:
    print(f"[compare] {msg}", file=sys.stderr, flush=True)


def median(values: list[float]) -> float | None:
    return bench_serving.percentile(values, 50) if values else None


def mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None
