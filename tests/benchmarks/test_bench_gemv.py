"""benchmarks/gpu/bench_gemv.py's plumbing on the CPU (--device cpu: the interpreter, tiny
shapes, a wall clock): every shape and row count timed both ways, a pick each, and the
kernel checked against float32. Its GPU figures come from benchmarks/gpu_check.sh."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytest.importorskip("triton")


def test_bench_gemv_runs_on_the_cpu():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    got = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks/gpu/bench_gemv.py"), "--device", "cpu",
         "--rows", "1,8", "--splits", "1,2"],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert got.returncode == 0, got.stderr[-2000:]
    rows = re.findall(
        r"^\s+(\w+)\s+(\d+)x(\d+)\s+(\d)\s+(\d+)\s.*(gemv|F\.linear)$", got.stdout, re.M
    )
    assert {(r[0], r[3]) for r in rows} == {
        (s, m) for s in ("qkv", "o", "gate_up", "down", "head") for m in ("1", "8")
    }
    assert {r[4] for r in rows if r[0] == "down"} == {"2"}  # K 640: split on 8 "SMs"
    assert got.stdout.count("within one bf16 rounding: True") == 5
    assert "tiny batch 1, the linears of a step" in got.stdout
    sweeps = re.findall(
        r"split sweep at 1 rows, us: 1: [\d.]+, 2: [\d.]+ \(rule: (\d+)\)", got.stdout
    )
    assert sweeps == ["1", "1", "1", "2", "1"]  # qkv, o, gate_up, down, head
