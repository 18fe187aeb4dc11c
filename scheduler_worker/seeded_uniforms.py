"""Counter-based uniforms for seeded rows (sampling.py's module doc, "Seeds"): each number a
hash of (seed, the token's index, column) alone, so a seeded request draws the same numbers
whatever else is in the batch, on any device, after a preemption too, with no generator
call a row."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

import numpy as np
import torch

from scheduler_worker.logits_processors import _array

T = TypeVar("T", torch.Tensor, np.ndarray)

M32 = 0xFFFFFFFF


def _mix(x: T) -> T:
    """A 32-bit integer hash (T. Mueller's) on int64 tensors or numpy arrays holding values
    < 2**32: every product stays under 2**63, so no overflow on any device, and numpy's
    int64 gives the same numbers as torch's."""
    x = ((x >> 16) ^ x) * 0x45D9F3B & M32
    x = ((x >> 16) ^ x) * 0x45D9F3B & M32
    return (x >> 16) ^ x


def seeded_uniforms(
    seeds: Sequence[int], counters: Sequence[int], n: int, device: torch.device
) -> torch.Tensor:
    """[rows, n] uniforms in (0, 1), each a function of (seed, counter, column) alone, for
    every seeded row at once (a counter-based generator, as Philox is): a seeded request's
    i-th token draws the same numbers whatever else is in the batch, on any device, after a
    preemption too, with no generator call a row. counters: each row's output tokens so far."""
    keys = [[s & M32, (s >> 32) & M32, c & M32] for s, c in zip(seeds, counters)]
    return uniforms(np.array(keys, dtype=np.int64).reshape(-1, 3), n, device)


def uniforms(keys: np.ndarray, n: int, device: torch.device) -> torch.Tensor:
    """seeded_uniforms from its keys [rows, 3] int64: (seed's low and high 32 bits, counter).
    The rows' keys are hashed on the host (numpy: a few µs, where ~30 small device ops cost
    a launch each) and the columns' hash is kept per width, so the device runs one mix."""
    return row_uniforms(_array(row_keys(keys), device, torch.long), n)


def row_keys(keys: np.ndarray) -> np.ndarray:
    """Each row's key [rows] int64 (< 2**32) from its (seed low, seed high, counter) [rows,
    3]: what a draw op that makes the uniforms itself takes (triton_sample.py)."""
    return counter_keys(seed_keys(keys[:, :2]), keys[:, 2])


def seed_keys(seeds: np.ndarray) -> np.ndarray:
    """row_keys' part of the seed alone [rows] int64, from (seed low, seed high) [rows, 2]:
    the same every step of a row (the sampler keeps it with the batch's parameters)."""
    return _mix(_mix(seeds[:, 0] ^ 0x9E3779B9) ^ seeds[:, 1])


def counter_keys(seeded: np.ndarray, counters: np.ndarray) -> np.ndarray:
    """row_keys from seed_keys' [rows] and the counters [rows] (< 2**32)."""
    return _mix(seeded ^ counters)


def row_uniforms(k: torch.Tensor, n: int) -> torch.Tensor:
    """[rows, n] uniforms of the rows' keys k [rows] int64 (on their device): the hash of
    each key with each column's."""
    x = _mix(k[:, None] ^ _columns(n, k.device)[None, :])
    # 24 bits, never 0; float32 rounds the largest, (2**24 - 0.5) / 2**24, to 1.0 (a race
    # gives a zero probability's 0 / log(1) no chance: sampling._race)
    return ((x >> 8).float() + 0.5) * (1.0 / (1 << 24))


_COLUMNS: dict[tuple[int, torch.device], torch.Tensor] = {}


def _columns(n: int, device: torch.device) -> torch.Tensor:
    """The columns' hash, the same at every step of a width (num_uniforms of a vocabulary)."""
    cols = _COLUMNS.get((n, device))
    if cols is None:
        cols = _COLUMNS[(n, device)] = _mix(torch.arange(n, device=device) + 0x632BE5AB)
    return cols
