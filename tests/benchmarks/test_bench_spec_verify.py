"""benchmarks/bench_spec_verify.py --costs's plumbing (the GPU check's stage 9d on a CPU):
each k of each row count gives a plain decode step and each verify path asked for, as a
positive time and a cost in decode steps."""

from __future__ import annotations

import re

import pytest

from scheduler_worker import kernels
from tests.benchmarks import run_bench


@pytest.mark.skipif(not kernels.load(), reason="the C++ kernels are not built here")
def test_bench_spec_verify_times_each_k_and_path(default_model_dir):
    args = ["--costs", "--rows", "1", "--context", "32", "--reps", "2", "--threads", "1"]
    out = run_bench("bench_spec_verify.py", *args, "--num-speculative-tokens", "1", "3")
    assert re.search(r"^cpu .*, gpu none, backend cpu$", out, re.M), out
    lines = re.findall(r"^rows 1, context 32, k (\d), 2 reps: decode ([\d.]+) ms(.*)$", out, re.M)
    assert [k for k, _, _ in lines] == ["1", "3"], out
    for _, decode, rest in lines:
        costs = re.findall(r"(chunk|rows) verify ([\d.]+) ms \([\d.]+-[\d.]+\) = ([\d.]+)", rest)
        assert [c for c, _, _ in costs] == ["chunk", "rows"], rest
        assert float(decode) > 0 and all(float(ms) > 0 and float(x) > 0 for _, ms, x in costs)
