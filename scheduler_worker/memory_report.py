"""Where the scheduler's resident memory goes, counted, so that a leak can be told from
memory that is meant to grow (issue 40, item 5):

    resident (/proc/self/statm) = weights + KV pages touched so far + malloc's heap
                                  (in use + freed but kept) + the rest (Python, libraries)

- KV pages: the CPU's pool is anonymous maps (backends/cpu_kv_pool.py) that the kernel
  fills with zero pages on first write, so resident KV grows as the block manager hands
  out blocks it has not handed out before (LRU reuse walks the whole pool in time), up to
  the pool's size; counted page by page with mincore(2).
- The heap keeps what it freed (heap.py: no trimming after start-up, step buffers
  reused): its high-water mark of step buffers stays resident. In use: malloc's own count
  (mallinfo2). Kept free: the arenas' resident pages (mincore over heap.arena_ranges)
  less the bytes in use there, since malloc's count of free bytes still holds what
  start-up's trim handed back.

A leak is what grows besides these: the heap's bytes in use, or the rest. The scheduler
reports the figures in its status (EngineStatus.memory, `zeroserve:scheduler_memory_bytes`
in /metrics), and the soak test (tests/e2e/test_soak.py) holds them to account.
"""

from __future__ import annotations

import ctypes
import mmap

import torch

from scheduler_worker.backends.device import in_host_memory
from scheduler_worker.heap import arena_ranges, heap_figures

PAGE = mmap.PAGESIZE
_LOW_BIT = bytes(b & 1 for b in range(256))  # mincore's byte per page: bit 0 = resident


def resident_bytes() -> int | None:
    """This process's resident set (None where /proc is not there)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * PAGE
    except (OSError, ValueError, IndexError):
        return None


def _mincore():
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
    except OSError:
        return None
    fn = getattr(libc, "mincore", None)
    if fn is not None:
        fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
        fn.restype = ctypes.c_int
    return fn


_MINCORE = _mincore()


def _resident(start: int, nbytes: int) -> int | None:
    """Resident bytes of [start, start + nbytes) (whole pages), by mincore(2)."""
    assert _MINCORE is not None
    first = start - start % PAGE
    length = start + nbytes - first
    vec = ctypes.create_string_buffer(-(-length // PAGE))
    if _MINCORE(first, length, vec) != 0:
        return None
    return vec.raw.translate(_LOW_BIT).count(1) * PAGE


def resident_tensor_bytes(tensors: list[torch.Tensor]) -> int | None:
    """Bytes of these CPU tensors' memory that is resident (page by page, mincore(2));
    None where mincore is not to be had."""
    if _MINCORE is None:
        return None
    total = 0
    for t in tensors:
        if not in_host_memory(t) or t.numel() == 0:
            continue
        n = _resident(t.data_ptr(), t.numel() * t.element_size())
        if n is None:
            return None
        total += n
    return total


def heap_kept_free_bytes(arena_in_use: int, free: int) -> int:
    """The free bytes malloc's arenas keep resident: their resident pages less the bytes
    handed out there (at most `free`, malloc's own count, which holds trimmed pages too;
    that count where the arenas cannot be read)."""
    ranges = arena_ranges() if _MINCORE is not None else None
    if ranges is None:
        return free
    resident = 0
    for start, length in ranges:
        resident += _resident(start, length) or 0  # None: unmapped since (a heap freed)
    return min(free, max(0, resident - arena_in_use))


def memory_figures(kv_caches: list[tuple[torch.Tensor, torch.Tensor]]) -> dict[str, float]:
    """The scheduler's memory parts now, in bytes (those this machine can count)."""
    out: dict[str, float] = {}
    rss = resident_bytes()
    if rss is not None:
        out["resident_bytes"] = float(rss)
    kv = resident_tensor_bytes([t for pair in kv_caches for t in pair])
    if kv is not None:
        out["kv_resident_bytes"] = float(kv)
    heap = heap_figures()
    if heap is not None:
        out["heap_in_use_bytes"] = float(heap[0])
        out["heap_kept_free_bytes"] = float(heap_kept_free_bytes(heap[1], heap[2]))
    return out
