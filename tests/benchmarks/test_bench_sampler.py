"""benchmarks/bench_sampler.py's plumbing: both paths timed on the chat mix, the ratio
printed, and the seeded rows' tokens compared (the op's near-ties aside, none differ on its
rows)."""

from __future__ import annotations

import re

import pytest

from scheduler_worker import kernels
from tests.benchmarks import run_bench


@pytest.mark.skipif(not kernels.load(), reason="the C++ kernels are not built here")
def test_bench_sampler_times_both_paths_and_compares_seeded_rows():
    args = ["--rows", "16", "--vocab", "4096", "--threads", "1", "--repeat", "2", "--rounds", "1"]
    out = run_bench("bench_sampler.py", *args)
    line = re.search(
        r"threads 1 vocab 4096 rows 16: torch ([\d.]+) / ([\d.]+) ms .* op ([\d.]+) / ([\d.]+) ms"
        r".*: ([\d.]+)x; seeded rows differing (\d+) of (\d+)",
        out,
    )
    assert line, out
    assert all(float(line[i]) > 0 for i in range(1, 6))
    assert int(line[7]) == 4 and int(line[6]) <= 1  # rows 1, 5, 9, 13 are seeded
