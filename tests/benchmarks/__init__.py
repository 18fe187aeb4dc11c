"""The benchmarks' plumbing, run small: `run_bench` runs one as a user would."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_bench(script: str, *args: str, timeout: float = 120) -> str:
    """benchmarks/<script> with `args`, from the repository root: its stdout (it must exit 0)."""
    return subprocess.run(
        [sys.executable, f"benchmarks/{script}", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=True,
    ).stdout
