"""Arrays that are views of a file's memory map (numpy.memmap, as the GGUF header reader
makes them): where in the file they lie, and dropping the map's resident pages.

The loader reads every tensor of a GGUF file through one map, so once the model is built
all of the file's pages that it read are resident in the process (counted in its RSS,
though they are page cache). After the swap nothing reads the map (the linears hold
their repacked or copied bytes, the embedding reads its rows with pread: embedding.py),
so the loader drops its pages (`drop_map_pages`): a later read faults them back in.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Iterable

import numpy as np


def memmap_of(a: np.ndarray) -> np.memmap | None:
    """The numpy.memmap (with its mmap) that `a` is a view of, if any."""
    base: object = a
    while isinstance(base, np.ndarray):
        if isinstance(base, np.memmap) and getattr(base, "_mmap", None) is not None:
            return base
        base = base.base
    return None


def file_of(a: np.ndarray) -> tuple[str, int] | None:
    """(path, byte offset in the file) of a C-contiguous view of a file's memmap; None for
    any other array (in memory, or not contiguous: a copy then)."""
    mm = memmap_of(a)
    if mm is None or not a.flags.c_contiguous or mm.filename is None:
        return None
    raw = mm._mmap  # type: ignore[attr-defined]  # the mmap.mmap under numpy.memmap
    start = int(np.frombuffer(raw, dtype=np.uint8).ctypes.data)  # the map's first byte
    map_offset = mm.offset - mm.offset % mmap.ALLOCATIONGRANULARITY  # where the map begins
    return os.fspath(mm.filename), int(a.ctypes.data) - start + map_offset


def drop_map_pages(arrays: Iterable[np.ndarray]) -> int:
    """madvise(MADV_DONTNEED) over the whole of each map these arrays are views of (each
    once): their resident pages leave the process (the page cache keeps them; a read of
    the map faults them back in). Returns the bytes of map released."""
    done: dict[int, int] = {}
    for a in arrays:
        mm = memmap_of(a)
        raw = None if mm is None else mm._mmap  # type: ignore[attr-defined]
        if raw is None or id(raw) in done or not hasattr(mmap, "MADV_DONTNEED"):
            continue
        raw.madvise(mmap.MADV_DONTNEED)
        done[id(raw)] = len(raw)
    return sum(done.values())
