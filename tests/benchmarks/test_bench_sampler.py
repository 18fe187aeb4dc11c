"""benchmarks/bench_sampler.py's plumbing: both paths timed on the chat mix, the ratio
printed, and the seeded rows' tokens compared (the op's near-ties aside, none differ on its
rows)."""

from __future__ import annotations

import re

import pytest

from scheduler_worker import kernels
from tests.benchmarks import run_bench


def _figures(pattern: str, out: str, timed: int) -> re.Match:
    """The line `pattern` finds in the bench's output; its first `timed` groups positive."""
    line = re.search(pattern, out)
    assert line, out
    assert all(float(line[i]) > 0 for i in range(1, timed + 1)), line[0]
    return line


@pytest.mark.skipif(not kernels.load(), reason="the C++ kernels are not built here")
def test_bench_sampler_times_both_paths_and_compares_seeded_rows():
    args = ["--rows", "16", "--vocab", "4096", "--threads", "1", "--repeat", "2", "--rounds", "1"]
    out = run_bench("bench_sampler.py", *args)
    line = _figures(
        r"threads 1 vocab 4096 rows 16: torch ([\d.]+) / ([\d.]+) ms .* op ([\d.]+) / ([\d.]+) ms"
        r".*: ([\d.]+)x; seeded rows differing (\d+) of (\d+)",
        out,
        5,
    )
    assert int(line[7]) == 4 and int(line[6]) <= 1  # rows 1, 5, 9, 13 are seeded


def test_the_gpu_comparison_runs_the_backends_op(monkeypatch, capsys):
    """--device cuda (the GPU check's stage 9e) on a CPU: its CUDA calls stood in, the
    Triton kernel interpreted, tiny rows. It times the torch path against the op CudaBackend
    declares (keyed) and the seeded rows draw the same tokens on both."""
    import argparse

    import torch

    from benchmarks import bench_sampler

    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "a CPU, interpreted")
    real = bench_sampler.make_rows
    monkeypatch.setattr(bench_sampler, "make_rows", lambda k, n, v, dev: real(k, n, v, "cpu"))
    bench_sampler.main_cuda(argparse.Namespace(vocab=[700], rows=[6], rounds=1, repeat=1))
    out = capsys.readouterr().out
    line = _figures(
        r"cuda vocab 700 rows 6: to the host torch ([\d.]+) / [\d.]+ ms, op ([\d.]+) / [\d.]+ ms"
        r".* host enqueue torch ([\d.]+) ms, op ([\d.]+) ms; seeded rows differing (\d+) of (\d+)",
        out,
        4,
    )
    assert (line[5], line[6]) == ("0", "2")  # rows 1 and 5 are seeded
