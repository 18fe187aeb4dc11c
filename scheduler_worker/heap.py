"""Large step buffers from the heap, not from fresh page-faulted maps.

glibc's malloc serves a request above its mmap threshold (dynamic, at most 32 MiB) with a
new anonymous map and unmaps it when freed, so such a buffer is zero-filled by the kernel
page by page each time it is made again. An engine makes the same large buffers every
step: the [rows, vocab] logits and the sampler's copies of them are 32 MiB at 32 rows of
Gemma 3's 262,144-token vocabulary, and a pass over one took several times as long that
way as from the heap (docs/benchmarks.md, "Start-up, where it went and what changed").
The engine raises the mmap threshold (and the trim threshold, so the heap keeps what it
freed) once at start: its buffers are then reused from the heap. The heap keeps its
high-water mark of step buffers (tens of MB) instead of handing them back between steps;
the KV pool and the GGUF file are maps of their own.

What start-up freed is given back once (`release_freed_heap`, malloc_trim): repacking a
GGUF file's tied head peaks at hundreds of MiB of temporaries (558 MiB for Gemma 3's
262,144-token Q8_0 head), and the llguidance tokenizer's build frees its temporaries; with
the trim threshold raised, that peak would stay resident for the process's life. The
trim hands back the free pages; the step buffers then come back from the heap as they
are made (faulted in once, then kept).

malloc's own count of free bytes (mallinfo2's fordblks) still holds the trimmed,
non-resident pages, so the free bytes the heap keeps resident are counted from its maps
(`arena_ranges`, memory_report.py: mincore over them).
"""

from __future__ import annotations

import ctypes
import os
import sys

from common.log import get_logger

log = get_logger("zeroserve.heap")

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters
HEAP_MAX = 64 << 20  # glibc's HEAP_MAX_SIZE on 64-bit: one thread arena heap's map
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


def release_freed_heap() -> bool:
    """Hand the heap's free pages back to the kernel (malloc_trim(0), every arena): once
    after start-up, whose peak would otherwise stay resident (see the module's doc).
    False without glibc."""
    libc = _libc()
    if libc is None or not hasattr(libc, "malloc_trim"):
        return False
    libc.malloc_trim(0)
    return True


def heap_figures() -> tuple[int, int, int] | None:
    """(bytes malloc hands out now, of which in its arenas, bytes it holds freed), from
    mallinfo2: the first grows with a leak; the last counts trimmed pages too (see
    `arena_ranges`). None without glibc's mallinfo2."""
    libc = _libc()
    if libc is None or not hasattr(libc, "mallinfo2"):
        return None
    libc.mallinfo2.restype = MallInfo2
    m = libc.mallinfo2()
    return int(m.uordblks) + int(m.hblkhd), int(m.uordblks), int(m.fordblks)


def arena_ranges() -> list[tuple[int, int]] | None:
    """(start, length) of malloc's arenas' memory: the main arena's `[heap]` (brk), and each
    thread arena's heaps: anonymous read-write maps on a HEAP_MAX boundary that begin with
    glibc's heap_info, whose mprotect_size is the map's read-write length (read through
    /proc/self/mem: a heap unmapped meanwhile is an error there, not a fault). None where
    /proc is not there."""
    try:
        with open("/proc/self/maps") as f:
            lines = f.read().splitlines()
        mem = os.open("/proc/self/mem", os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None
    out = []
    try:
        for line in lines:
            fields = line.split()
            lo, hi = (int(x, 16) for x in fields[0].split("-"))
            name = fields[5] if len(fields) > 5 else ""
            if name == "[heap]" or (not name and _thread_heap(mem, fields[1], lo, hi)):
                out.append((lo, hi - lo))
    finally:
        os.close(mem)
    return out


def _thread_heap(mem: int, perms: str, lo: int, hi: int) -> bool:
    """Whether the anonymous map [lo, hi) is a thread arena's heap (arena_ranges)."""
    rw = perms.startswith("rw") and lo % HEAP_MAX == 0 and hi - lo <= HEAP_MAX
    return rw and _mprotect_size(mem, lo) == hi - lo


def _mprotect_size(mem: int, addr: int) -> int | None:
    """glibc's heap_info at the start of a thread arena's heap is {ar_ptr, prev, size,
    mprotect_size, ...}: its mprotect_size (None if the address cannot be read)."""
    word = ctypes.sizeof(ctypes.c_size_t)
    try:
        raw = os.pread(mem, word, addr + 3 * word)
    except OSError:
        return None
    return int.from_bytes(raw, sys.byteorder) if len(raw) == word else None
