"""The scheduler's memory account (scheduler_worker/memory_report.py), the soak test's way
of telling a leak from memory meant to grow: KV pages count as they are first written,
a buffer made and kept counts as heap in use, and the resident set covers both."""

from __future__ import annotations

import torch

from scheduler_worker.heap import heap_figures
from scheduler_worker.kv_pool import zero_pages
from scheduler_worker.memory_report import memory_figures, resident_tensor_bytes

MiB = 1 << 20


def test_kv_pages_count_when_first_written():
    k = zero_pages((512, 16, 4, 64), torch.float16)  # 512 blocks of 8 KiB
    assert resident_tensor_bytes([k]) == 0
    k[:128].fill_(1.0)  # a quarter of the blocks: 1 MiB
    assert resident_tensor_bytes([k]) == 1 * MiB
    k[:128].fill_(2.0)  # written again: nothing new
    assert resident_tensor_bytes([k]) == 1 * MiB


def test_a_kept_allocation_shows_as_heap_in_use_and_resident():
    before = memory_figures([])
    kept = b"\x01" * (64 * MiB)  # malloc'd and written: a leak's shape
    after = memory_figures([])
    assert after["heap_in_use_bytes"] - before["heap_in_use_bytes"] >= 60 * MiB
    assert after["resident_bytes"] - before["resident_bytes"] >= 60 * MiB
    del kept
    assert heap_figures() is not None
