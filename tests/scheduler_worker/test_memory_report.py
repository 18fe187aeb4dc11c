"""The scheduler's memory account (scheduler_worker/memory_report.py), the soak test's way
of telling a leak from memory meant to grow: KV pages count as they are first written,
a buffer made and kept counts as heap in use, and the resident set covers both."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import torch

from scheduler_worker.backends.cpu_kv_pool import zero_pages
from scheduler_worker.heap import heap_figures
from scheduler_worker.memory_report import resident_tensor_bytes

MiB = 1 << 20


def test_kv_pages_count_when_first_written():
    k = zero_pages((512, 16, 4, 64), torch.float16)  # 512 blocks of 8 KiB
    assert resident_tensor_bytes([k]) == 0
    k[:128].fill_(1.0)  # a quarter of the blocks: 1 MiB
    assert resident_tensor_bytes([k]) == 1 * MiB
    k[:128].fill_(2.0)  # written again: nothing new
    assert resident_tensor_bytes([k]) == 1 * MiB


def test_a_kept_allocation_shows_as_heap_in_use_and_resident():
    """In a process of its own with the scheduler's malloc settings (heap.py): the test
    process's heap holds whatever the suite left in it."""
    code = (
        "from scheduler_worker.heap import keep_step_buffers_in_heap\n"
        "from scheduler_worker.memory_report import memory_figures\n"
        "keep_step_buffers_in_heap()\n"
        "before = memory_figures([])\n"
        "kept = b'\\x01' * (64 << 20)  # malloc'd and written: a leak's shape\n"
        "after = memory_figures([])\n"
        "print(after['heap_in_use_bytes'] - before['heap_in_use_bytes'],"
        " after['resident_bytes'] - before['resident_bytes'],"
        " after['heap_kept_free_bytes'] - before['heap_kept_free_bytes'])\n"
    )
    heap, resident, kept = _numbers_printed_by(code)
    assert heap >= 60 * MiB and resident >= 60 * MiB, (heap / MiB, resident / MiB)
    assert kept <= 4 * MiB, kept / MiB  # kept free heap does not explain a leak away
    assert heap_figures() is not None


def test_kept_free_heap_is_what_stays_resident():
    """Freed heap kept by the raised trim threshold counts as kept free, in the main arena
    and in a thread's; once trimmed (release_freed_heap) the main arena's no longer does,
    though mallinfo2 still counts it free. (malloc_trim leaves a thread arena's top chunk
    resident: glibc trims it only on a free, against the trim threshold.)"""
    code = (
        "import threading\n"
        "from scheduler_worker.heap import heap_figures, keep_step_buffers_in_heap,"
        " release_freed_heap\n"
        "from scheduler_worker.memory_report import memory_figures\n"
        "keep_step_buffers_in_heap()\n"
        "def churn():  # 64 MiB in 1 MiB blocks, written, then freed\n"
        "    blocks = [b'\\x01' * (1 << 20) for _ in range(64)]\n"
        "    del blocks\n"
        "def kept():\n"
        "    return memory_figures([])['heap_kept_free_bytes']\n"
        "k0 = kept()\n"
        "churn()\n"
        "k1 = kept()\n"
        "t = threading.Thread(target=churn)\n"
        "t.start()\n"
        "t.join()\n"
        "k2, r2, f2 = kept(), memory_figures([])['resident_bytes'], heap_figures()[2]\n"
        "release_freed_heap()\n"
        "k3, r3, f3 = kept(), memory_figures([])['resident_bytes'], heap_figures()[2]\n"
        "print(k1 - k0, k2 - k1, k3 - k0, r2 - r3, f3)\n"
    )
    main, thread, trimmed, released, free = (v / MiB for v in _numbers_printed_by(code))
    assert main >= 60 and thread >= 60, (main, thread)  # kept, in either arena
    assert trimmed <= thread + 8 and released >= 60, (trimmed, released)  # given back
    assert free >= 60, free  # what malloc's own count would still have said


def _numbers_printed_by(code: str) -> list[float]:
    """The numbers `code` prints, run in a fresh interpreter from the repository root (the
    scheduler's malloc settings, none of the suite's heap)."""
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=root, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return [float(v) for v in out.stdout.split()]
