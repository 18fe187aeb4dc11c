"""The engine keeps its large step buffers in the heap (scheduler_worker/heap.py): a
buffer above glibc's default mmap threshold is then not a fresh map, page-faulted anew
each time it is made. Checked in fresh processes through glibc's own mallinfo2."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from scheduler_worker.heap import mapped_bytes

REPO = Path(__file__).resolve().parents[2]
PROBE = """
import sys, torch
from scheduler_worker.heap import keep_step_buffers_in_heap, mapped_bytes
if sys.argv[1] == "keep":
    assert keep_step_buffers_in_heap()
elif sys.argv[1] == "engine":  # an engine, built as the scheduler builds it
    from common.config import CacheConfig, EngineConfig, ModelConfig
    from scheduler_worker.engine import LLMEngine

    model = ModelConfig(model=sys.argv[2])
    LLMEngine(EngineConfig(model=model, cache=CacheConfig(num_blocks=8)), sys.argv[2])
before = mapped_bytes()
x = torch.empty(48 << 20, dtype=torch.uint8)  # 48 MiB: above the default threshold's 32
x.fill_(1)
print(mapped_bytes() - before)
"""


def _mapped_growth(*mode: str) -> int:
    out = subprocess.run(
        [sys.executable, "-c", PROBE, *mode],
        cwd=REPO,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    return int(out.stdout.split()[-1])


@pytest.mark.skipif(mapped_bytes() is None, reason="not glibc (no mallinfo2)")
def test_large_buffers_come_from_the_heap_once_the_engine_set_it_up():
    assert _mapped_growth("default") >= 48 << 20  # glibc's default: a map of its own
    assert _mapped_growth("keep") < 1 << 20  # the engine's setting: from the heap


@pytest.mark.skipif(mapped_bytes() is None, reason="not glibc (no mallinfo2)")
def test_an_engine_sets_it_up(tiny_llama_dir):
    assert _mapped_growth("engine", str(tiny_llama_dir)) < 1 << 20
