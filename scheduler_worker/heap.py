"""Large step buffers from the heap, not from fresh page-faulted maps.

glibc's malloc serves a request above its mmap threshold (dynamic, at most 32 MiB) with
a new anonymous map and unmaps it when freed, so such a buffer is zero-filled by the
kernel page by page each time it is made again. An engine makes the same large buffers
every step: the [rows, vocab] logits and the sampler's copies of them are 32 MiB at 32
rows of Gemma 3's 262,144-token vocabulary, and `nan_to_num` on one took 16.6 ms that
way against 2.9 ms from the heap (AMD EPYC Zen 4, one thread). The engine raises the
mmap threshold (and the trim threshold, so the heap keeps what it freed) once at start:
its buffers are then reused from the heap. The heap keeps its high-water mark of step
buffers (tens of MB) instead of handing them back between steps; what is made once
(weights) takes the same memory either way, and the KV pool and the GGUF file are maps
of their own.
"""

from __future__ import annotations

import ctypes
import sys

from common.log import get_logger

log = get_logger("zeroserve.heap")

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters
MMAP_THRESHOLD = 1 << 30  # 1 GiB: every step buffer comes from the heap
TRIM_THRESHOLD = (1 << 31) - 1  # the largest an int takes: the heap is not trimmed


class MallInfo2(ctypes.Structure):
    """glibc's struct mallinfo2 (2.33 and later): the heap's figures, in bytes."""

    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",  # bytes in mmapped chunks
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:  # not glibc (musl names it otherwise and has no mallopt)
        return None
    return libc if hasattr(libc, "mallopt") else None


def keep_step_buffers_in_heap() -> bool:
    """Raise glibc's mmap and trim thresholds (see the module's doc); False where the C
    library is not glibc or refuses, and nothing changes."""
    libc = _libc()
    if libc is None:
        return False
    ok = libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
    ok = ok and libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
    if not ok:
        log.info("malloc thresholds left as they are (mallopt refused)")
    return ok


def mapped_bytes() -> int | None:
    """Bytes malloc holds in mmapped chunks now (None without glibc's mallinfo2)."""
    libc = _libc()
    if libc is None or not hasattr(libc, "mallinfo2"):
        return None
    libc.mallinfo2.restype = MallInfo2
    return int(libc.mallinfo2().hblkhd)


def heap_figures() -> tuple[int, int] | None:
    """(bytes malloc hands out now, bytes it holds freed), from mallinfo2: the first
    grows with a leak, the second with the high-water mark of step buffers it keeps.
    None without glibc's mallinfo2."""
    libc = _libc()
    if libc is None or not hasattr(libc, "mallinfo2"):
        return None
    libc.mallinfo2.restype = MallInfo2
    m = libc.mallinfo2()
    return int(m.uordblks) + int(m.hblkhd), int(m.fordblks)
