"""benchmarks/bench_sampler.py's plumbing: both paths timed on the chat mix, the ratio
printed, and the seeded rows' tokens compared (the op's near-ties aside, none differ on its
rows)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from scheduler_worker import kernels

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(not kernels.load(), reason="the C++ kernels are not built here")
def test_bench_sampler_times_both_paths_and_compares_seeded_rows():
    out = subprocess.run(
        [sys.executable, "benchmarks/bench_sampler.py", "--rows", "16", "--vocab", "4096"]
        + ["--threads", "1", "--repeat", "2", "--rounds", "1"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    line = re.search(
        r"threads 1 vocab 4096 rows 16: torch ([\d.]+) / ([\d.]+) ms .* op ([\d.]+) / ([\d.]+) ms"
        r".*: ([\d.]+)x; seeded rows differing (\d+) of (\d+)",
        out,
    )
    assert line, out
    assert all(float(line[i]) > 0 for i in range(1, 6))
    assert int(line[7]) == 4 and int(line[6]) <= 1  # rows 1, 5, 9, 13 are seeded
