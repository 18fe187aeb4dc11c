"""The kernels' packed weights on huge pages: each QuantLinear's bytes copied into large
anonymous maps advised MADV_HUGEPAGE (transparent huge pages in `madvise` mode, the
common default), one after another in load order.

A decode step reads every weight of the model once. On 4 KB pages a 100 MB model spans
~25,000 pages a step, far past the TLB, and each page's first touch waits on a page walk
that the kernels' prefetches do not hide; torch's allocator gives each linear (mostly
under 2 MB) its own 4 KB pages. On 2 MB pages the same bytes span ~50. The figures:
docs/benchmarks.md, "AVX2 ops at 8 rows, eighth session".

Invariant: a tensor `hold` returns is a view of one chunk and keeps that chunk's map
alive (torch.frombuffer holds the buffer); a chunk is unmapped once the arena has moved
on from it and no view of it is left. Where the system has no MADV_HUGEPAGE (or THP is
off) the maps are plain anonymous memory: the same bytes, the same results.
"""

from __future__ import annotations

import mmap

import torch

HUGE_PAGE = 2 << 20
CHUNK_BYTES = 64 << 20  # virtual; only the pages written become resident
ALIGN = 64  # a cache line: the kernels' loads of a block never straddle one more than needed


class WeightArena:
    """A bump allocator over chunks of huge-page-advised anonymous memory."""

    def __init__(self, chunk_bytes: int = CHUNK_BYTES) -> None:
        self.chunk_bytes = chunk_bytes
        self._chunk: torch.Tensor | None = None  # uint8 view of the current chunk
        self._used = 0

    def _new_chunk(self, need: int) -> None:
        size = max(self.chunk_bytes, -(-need // HUGE_PAGE) * HUGE_PAGE)
        # one huge page more, to start the view on a 2 MB boundary (THP maps aligned ranges)
        mm = mmap.mmap(-1, size + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        if hasattr(mmap, "MADV_HUGEPAGE"):
            mm.madvise(mmap.MADV_HUGEPAGE)
        whole = torch.frombuffer(mm, dtype=torch.uint8)
        start = -whole.data_ptr() % HUGE_PAGE
        self._chunk = whole[start : start + size]
        self._used = 0

    def hold(self, t: torch.Tensor) -> torch.Tensor:
        """A copy of `t` (same dtype and shape, contiguous) in the arena, 64-byte aligned."""
        nbytes = t.numel() * t.element_size()
        at = -(-self._used // ALIGN) * ALIGN
        if self._chunk is None or at + nbytes > self._chunk.numel():
            self._new_chunk(nbytes)
            at = 0
        assert self._chunk is not None
        self._used = at + nbytes
        out = self._chunk[at : at + nbytes].view(t.dtype).view(t.shape)
        out.copy_(t)
        return out


_ARENA = WeightArena()


def hold(t: torch.Tensor) -> torch.Tensor:
    """`t` copied into the process's weight arena (QuantLinear's packed bytes and scales)."""
    return _ARENA.hold(t)


def hold_scales(
    d: torch.Tensor, m: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A packed weight's d [groups, units, 16] (and m) in the arena. With an m, the two are
    interleaved unit by unit, one [groups, units, 2, 16] tensor whose halves are returned:
    a 1-row kernel then streams one array of scales instead of two (the kernels' layout:
    formats.h; docs/benchmarks.md, "AVX2 Q5_1 at one row, ninth session")."""
    if m is None:
        return hold(d), None
    dm = hold(torch.stack((d, m), dim=2))
    return dm[:, :, 0], dm[:, :, 1]
