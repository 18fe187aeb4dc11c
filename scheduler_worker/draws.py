"""A step's uniforms and, on the CPU kernels, the whole draw in one op.

`draw_uniforms`: the [rows, num_uniforms] uniforms a step's drawing rows race on (sampling.py's
module doc, "Drawing"): a seeded row's from its (seed, token index) hash (seeded_uniforms), the
others' from the default generator, in one call for all of them.

`kernel_sample`: where the backend has a draw op (backends/base.py DrawRows), temperature,
top-k, top-p, min-p and the race run as one op, each row in a few passes over its logits, and
the argmax rows beside them: on the CPU kernels the C++ op (kernels/csrc/sample_rows.cpp:
the torch path's ~8 passes over the batch were a third of a 32-row step's forward on the
chat mix, docs/benchmarks.md, "Host step, eleventh session"), on a GPU one Triton launch
(backends/triton_sample.py, where the torch path issues ~80 ops). The same uniforms, so
the same tokens but at near-ties (their exp and their float32 sums' order are not torch's:
two race values, or a probability and a threshold, within ~1e-6 of each other); a seeded
row draws what it would alone.
`kernel_logprobs`: the logprobs rows' likewise.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import numpy as np
import torch

from scheduler_worker.backends.base import DrawRows
from scheduler_worker.backends.int_columns import int64_array
from scheduler_worker.batch_params import (
    HAS_SEED,
    MIN_P,
    SEED_HI,
    SEED_LO,
    TEMPERATURE,
    TOP_K,
    TOP_P,
)
from scheduler_worker.logits_processors import DeviceColumns, Rows, _array, _column
from scheduler_worker.seeded_uniforms import M32, counter_keys, seed_keys, uniforms

_KERNEL_COLUMNS = [TEMPERATURE, TOP_K, TOP_P, MIN_P]  # sample_rows' params, in its order


def draw_uniforms(
    rows: Rows,
    values: np.ndarray,
    n: int,
    dev: torch.device,
    cols: DeviceColumns | None = None,
) -> torch.Tensor:
    """[len(rows), n] uniforms for drawing rows (values: their numbers)."""
    has_seed = values[:, HAS_SEED] != 0
    if not has_seed.any():  # unseeded rows share the default generator
        return torch.rand(len(rows), n, device=dev)
    seeded = has_seed.nonzero()[0]
    u = uniforms(_seed_keys(rows, values, seeded), n, dev)
    if len(seeded) == len(rows):
        return u
    shared = (~has_seed).nonzero()[0]
    full = torch.empty(len(rows), n, device=dev)
    rand = torch.rand(len(shared), n, device=dev)
    full.index_copy_(0, _column(cols, "unseeded", shared, dev, torch.long), rand)
    return full.index_copy_(0, _column(cols, "seeded", seeded, dev, torch.long), u)


class DrawColumns(NamedTuple):
    """What kernel_sample derives from a batch's parameters alone: kept with them
    (BatchParams.memo) while the rows are the same, so a step sends only its keys."""

    device: torch.device
    rows: torch.Tensor  # each row's index among the drawing rows (-1: an argmax row)
    params: torch.Tensor  # every row's _KERNEL_COLUMNS, float64
    seeded: np.ndarray  # the seeded rows, by their index among the drawing rows
    seeded_rows: list[int]  # the same rows, by their index in the batch
    seed_keys: np.ndarray  # their seeds' part of the key (seeded_uniforms.seed_keys)


def draw_columns(
    draws: list[int], values: np.ndarray, dev: torch.device, cols: DeviceColumns | None = None
) -> DrawColumns:
    """The DrawColumns of a batch whose rows `draws` draw (values: every row's numbers)."""
    draw = np.full(len(values), -1, dtype=np.int64)
    draw[draws] = np.arange(len(draws))
    params = np.ascontiguousarray(values[:, _KERNEL_COLUMNS])
    drawing = values[draws]
    seeded = (drawing[:, HAS_SEED] != 0).nonzero()[0]
    seeds = drawing[seeded][:, SEED_LO : SEED_HI + 1].astype(np.int64)
    return DrawColumns(
        dev,
        _column(cols, "draw.rows", draw, dev, torch.long),
        _column(cols, "draw.params", params, dev, torch.float64),
        seeded,
        [draws[i] for i in seeded.tolist()],
        seed_keys(seeds),
    )


class KeyPool:
    """Unseeded rows' keys for a keyed draw op: 32 random bits each from torch's default
    (host) generator, drawn `block` at a time, so a step takes a slice, not a generator call
    and a tensor's numpy view (five torch dispatches) of its own. A sampler's own: a new
    engine after torch.manual_seed draws what it drew before."""

    def __init__(self, block: int = 4096) -> None:
        self.block, self.keys, self.at = block, np.zeros(0, dtype=np.int64), 0

    def take(self, n: int) -> np.ndarray:
        """n fresh keys [n] int64, each < 2**32 (the caller may write into them)."""
        if self.at + n > len(self.keys):
            size = max(self.block, n)
            self.keys, self.at = torch.randint(0, 1 << 32, (size,), dtype=torch.long).numpy(), 0
        self.at += n
        return self.keys[self.at - n : self.at]


def draw_keys(
    rows: Rows, num_draws: int, columns: DrawColumns, pool: KeyPool | None = None
) -> np.ndarray:
    """Each drawing row's key [num_draws] int64 for a keyed draw op (seeded_uniforms.row_keys):
    a seeded row's of (seed, its token's index), so its uniforms are draw_uniforms' to the
    bit; the others' 32 random bits from torch's default (host) generator (`pool`'s, else
    drawn now)."""
    keys = (pool or KeyPool(num_draws)).take(num_draws)  # no pool: this step's alone
    if len(columns.seeded):
        picked = list(map(rows.__getitem__, columns.seeded_rows))
        keys[columns.seeded] = counter_keys(columns.seed_keys, _token_counts(picked))
    return keys


def _seed_keys(rows: Rows, values: np.ndarray, seeded: np.ndarray) -> np.ndarray:
    """The seeded rows' (seed low, seed high, token index) [len(seeded), 3] int64."""
    keys = np.empty((len(seeded), 3), dtype=np.int64)
    keys[:, :2] = values[seeded][:, SEED_LO : SEED_HI + 1]
    keys[:, 2] = _token_counts(list(map(rows.__getitem__, seeded.tolist())))
    return keys


def _token_counts(rows: Rows) -> np.ndarray:
    """Each row's output tokens before the position it samples (its drafts too), mod 2**32:
    a seeded row's counter."""
    # a comprehension: its loads are specialized, where map over attrgetters is not
    counts = [len(r.output_token_ids) + len(r.draft_token_ids) for r in rows]
    return int64_array(counts) & M32


@functools.cache
def cpu_draw_rows(isa: int) -> DrawRows:
    """The C++ op (kernels/csrc/sample_rows.cpp) on ISA path `isa`, as a DrawRows (one a
    path, not one a step)."""
    return DrawRows(
        lambda logits, draw, params, u: torch.ops.zeroserve.sample_rows(
            logits, draw, params, u, isa
        )
    )


def kernel_sample(
    logits: torch.Tensor,
    rows: Rows,
    draws: list[int],
    values: np.ndarray,
    n: int,
    op: DrawRows,
    cols: DeviceColumns | None = None,
    memo: dict[str, Any] | None = None,
    pool: KeyPool | None = None,
) -> torch.Tensor:
    """Tokens [rows] for processed logits [rows, vocab] (float32): rows `draws` draw
    (values: every row's numbers; n: num_uniforms(vocab)), the others take the argmax, in
    the backend's one op `op`. Its columns stay on the device while they hold (cols);
    `memo`: the batch's parameters' keeps (BatchParams.memo), where DrawColumns stay;
    `pool`: the sampler's unseeded keys (a keyed op's)."""
    dev = logits.device
    columns = memo.get("draw") if memo is not None else None
    if columns is None or columns.device != dev:
        columns = draw_columns(draws, values, dev, cols)
        if memo is not None:
            memo["draw"] = columns
    if op.keyed:  # the op makes the uniforms: only a key a row goes to the device
        last = _array(draw_keys(rows, len(draws), columns, pool), dev, torch.long)
    else:
        picked = list(map(rows.__getitem__, draws))
        last = draw_uniforms(picked, values[draws], n, dev, cols)
    # both ops read rows a stride apart: a padded vocabulary's view is not copied
    return op.fn(
        logits if logits.stride(-1) == 1 else logits.contiguous(),
        columns.rows,
        columns.params,
        last,
    )


def kernel_logprobs(
    raw: torch.Tensor, tokens: torch.Tensor, num_top: int, isa: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """For the rows asking for logprobs, raw: their raw logits [k, vocab] (float32, on the
    CPU), tokens: their sampled tokens [k]: (the tokens' logprobs [k], the top num_top
    logprobs [k, num_top], their ids [k, num_top]) in one op, where log_softmax writes
    [k, vocab] and topk reads it again; within float32 rounding of torch's (its exp)."""
    return torch.ops.zeroserve.logprob_rows(raw.contiguous(), tokens.contiguous(), num_top, isa)
