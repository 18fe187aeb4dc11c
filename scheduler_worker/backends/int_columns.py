"""A step's columns of Python ints (positions, slots, rows of the step in flight) as int64
numpy arrays, in struct's C loop: `np.array(values, dtype=np.int64)` packs an element at a
time through numpy's generic conversion (~300 instructions an element, counted under
callgrind: two such columns a step were ~5% of a 256-row step's host work), where
`struct.pack_into` converts each with one PyLong read (~90). The array is writable, as
np.array's."""

from __future__ import annotations

import struct
from collections.abc import Sequence

import numpy as np

_PACKERS: dict[int, struct.Struct] = {}  # by length: a step's row counts, a few hundred at most


def int64_array(values: Sequence[int]) -> np.ndarray:
    """values (ints, or anything with __index__) as a new int64 array; struct.error where
    one is not an int or out of int64's range (np.array: TypeError, OverflowError)."""
    n = len(values)
    packer = _PACKERS.get(n)
    if packer is None:
        if len(_PACKERS) > 4096:  # lengths seen are bounded by the batch; kept bounded anyway
            _PACKERS.clear()
        packer = _PACKERS[n] = struct.Struct(f"={n}q")
    buf = bytearray(packer.size)
    packer.pack_into(buf, 0, *values)
    return np.frombuffer(buf, dtype=np.int64)
