"""Repetition, presence and frequency penalties for a step's penalized rows, the last of
the logits processors (scheduler_worker.logits_processors) before sampling: each step's
counts are the sampler's kept per slot on the device (penalty_counts.py) plus the tokens
not yet on the host (the step in flight's, drafts), and the rows' numbers are kept with the
batch's parameters (PenaltyColumns in BatchParams.memo) while the rows are the same. Where
the device has the one op (`penalty_op`: the C++ kernels' on a CPU, the backend's Triton
launch on a GPU) a step without drafts applies them in it, not in ~12 torch ops, and the
op counts each row's token in flight into the kept counts as it reads it (COMMIT): an
overlapped step then sends the counts nothing (each row's last token is already there)."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain
from typing import Any, NamedTuple

import numpy as np
import torch

from scheduler_worker.backends.base import PenalizeRows
from scheduler_worker.backends.device import runs_cpu_kernels
from scheduler_worker.backends.int_columns import int64_array
from scheduler_worker.batch_params import FREQUENCY, PRESENCE, REPETITION, has_penalty, values_of
from scheduler_worker.logits_processors import (
    _DRAFTS,
    _OUTPUT_IDS,
    _PARAMS,
    DeviceColumns,
    Rows,
    SampledRow,
    _column,
    _flat_index,
)
from scheduler_worker.penalty_counts import PenaltyCounts


def _in_flight(
    rows: Rows, prev_tokens: torch.Tensor | None, cols: DeviceColumns | None = None
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(positions in rows, their tokens) of the rows whose last output token is the step in
    flight's (pending_row), read from its sampled tokens on the device: penalties count it
    without waiting for it to reach the host."""
    at = int64_array([row.pending_row for row in rows])
    where = (at >= 0).nonzero()[0]
    if not len(where):
        return None
    assert prev_tokens is not None, "a pending token with no step in flight"
    dev = prev_tokens.device
    return _column(cols, "pending.at", where, dev, torch.long), prev_tokens.index_select(
        0, _column(cols, "pending.row", at[where], dev, torch.long)
    )


def _outputs(row: SampledRow) -> Sequence[int]:
    """The row's output tokens before the position it samples (its drafts included)."""
    return (
        [*row.output_token_ids, *row.draft_token_ids]
        if row.draft_token_ids
        else row.output_token_ids
    )


class PenaltyColumns(NamedTuple):
    """What apply_penalties derives from the penalized rows' parameters alone: kept with
    them (BatchParams.memo) while the rows are the same."""

    device: torch.device
    rows: torch.Tensor  # the penalized rows' indices in the batch
    repetition: np.ndarray  # each one's numbers
    on_rep: np.ndarray  # repetition != 1.0
    any_rep: bool
    rep: torch.Tensor | None  # repetition [k] float32, where any_rep
    rep_on: torch.Tensor | None  # on_rep [k] bool, where some rows have it and some not
    presence: torch.Tensor | None  # [k] float32, where a row has one
    frequency: torch.Tensor | None
    nums: torch.Tensor  # [k, 3] float32: repetition, presence, frequency (the one op's)
    flags: int  # the terms some row has: 1 repetition, 2 presence, 4 frequency


def penalty_columns(
    pen: np.ndarray, idx: list[int], dev: torch.device, cols: DeviceColumns | None = None
) -> PenaltyColumns:
    """The PenaltyColumns of rows `idx` whose numbers are `pen` (batch_params' columns)."""
    reps, pres, freq = pen[:, REPETITION], pen[:, PRESENCE], pen[:, FREQUENCY]
    on_rep, f32 = reps != 1.0, torch.float32
    any_rep, any_pres, any_freq = bool(on_rep.any()), bool(pres.any()), bool(freq.any())
    nums = np.stack([reps, pres, freq], axis=1)
    return PenaltyColumns(
        dev,
        _column(cols, "penalty.rows", idx, dev, torch.long),
        reps,
        on_rep,
        any_rep,
        _column(cols, "penalty.repetition", reps, dev, f32) if any_rep else None,
        None
        if on_rep.all() or not any_rep
        else _column(cols, "penalty.on_rep", on_rep, dev, torch.bool),
        _column(cols, "penalty.presence", pres, dev, f32) if any_pres else None,
        _column(cols, "penalty.frequency", freq, dev, f32) if any_freq else None,
        _column(cols, "penalty.nums", nums, dev, f32),
        int(any_rep) | int(any_pres) << 1 | int(any_freq) << 2,
    )


COMMIT = 8  # penalize_rows' flag: the tokens in flight stay counted (PenaltyCounts.gather)
CPU_PENALIZE = PenalizeRows(lambda *args: torch.ops.zeroserve.penalize_rows(*args))


def penalty_op(
    backend_op: PenalizeRows | None, isa: int | None, device: torch.device
) -> PenalizeRows | None:
    """The one op for logits on `device`: the backend's, else the C++ kernels' (isa: the
    sampler's kernel_isa); None: the torch ops."""
    if backend_op is not None and backend_op.device == device.type:
        return backend_op
    return CPU_PENALIZE if isa is not None and runs_cpu_kernels(device) else None


def apply_penalties(
    logits: torch.Tensor,
    rows: Rows,
    prev_tokens: torch.Tensor | None = None,
    idx: list[int] | None = None,
    values: np.ndarray | None = None,
    pool: PenaltyCounts | None = None,
    cols: DeviceColumns | None = None,
    in_place: bool = False,
    memo: dict[str, Any] | None = None,
    op: PenalizeRows | None = None,
) -> torch.Tensor:
    """Repetition (HF: over prompt+output, logit>0 divided, <0 multiplied) and OpenAI
    presence/frequency (over output: logit -= presence*[count>0] + frequency*count).
    A row's token still in flight (pending_row) counts, from `prev_tokens` (the step in
    flight's tokens, on the device). Returns a new tensor (or `logits`: in_place); rows
    without penalties are unchanged. idx: the rows with a penalty, where known; values: every row's numbers
    (batch_params' columns, the sampler's kept by slot), else read from its parameters.
    pool: the sampler's counts kept per slot, read where every penalized row has a slot
    (the same logits, bit for bit); else each row's tokens are counted here. cols: the
    sampler's columns kept on the device (DeviceColumns), or None. in_place: the
    penalized rows go back into `logits` (the caller's to write), not into a copy of the
    batch's. memo: the batch's parameters' keeps (BatchParams.memo, for rows `idx`),
    where PenaltyColumns stay. op: the device's one op (penalty_op), used with `pool`
    where no row has drafts and the logits are float32."""
    if idx is None:
        idx = [i for i, r in enumerate(rows) if has_penalty(r.params)]
    if not idx:
        return logits
    dev = logits.device
    picked = list(map(rows.__getitem__, idx))  # the rows' own values, in C passes
    pc = memo.get("penalty") if memo is not None else None
    if pc is None or pc.device != dev:
        pen = values_of(list(map(_PARAMS, picked))) if values is None else values[idx]
        pc = penalty_columns(pen, idx, dev, cols)
        if memo is not None:
            memo["penalty"] = pc
    vocab = logits.shape[1]
    single = op is not None and logits.dtype == torch.float32  # the one op, without drafts
    got = (
        None
        if pool is None
        else pool.gather(picked, vocab, dev, single and prev_tokens is not None)
    )
    if got is not None:  # every row has a slot: the pool's counts are read
        at = _column(cols, "penalty.entries", got.entries, dev, torch.long)
        if single and not got.drafted:
            assert op is not None and pool is not None
            flags = pc.flags | (COMMIT if got.commit else 0)
            return _penalize_in_one_op(
                logits, got.pending, at, pool, pc, op, prev_tokens, cols, in_place, flags
            )
    sub = logits.index_select(0, pc.rows)  # a contiguous copy
    pending = _in_flight(picked, prev_tokens, cols)
    if got is not None:
        assert pool is not None and pool.counts is not None and pool.seen is not None
        counts = pool.counts.index_select(0, at).to(sub.dtype)
        if got.drafted:  # this step's own: a rejected draft leaves no trace
            flat = _flat_index(list(map(_DRAFTS, picked)), vocab, dev)
            counts.view(-1).index_add_(0, flat, torch.ones_like(flat, dtype=sub.dtype))
        if pending is not None:
            counts.index_put_(pending, torch.ones_like(pending[0], dtype=sub.dtype), True)
        if pc.rep is not None:
            seen = pool.seen.index_select(0, at).logical_or_(counts > 0)
            if pc.rep_on is not None:  # rows with repetition 1.0: as the per-row path, untouched
                seen.logical_and_(pc.rep_on[:, None])
            sub = _repetition(sub, seen, pc.rep)
        return _penalize(logits, sub, counts, pc, in_place)
    if pc.rep is not None:
        seqs = [
            list(chain(r.prompt_token_ids, r.output_token_ids, r.draft_token_ids)) if p else []
            for r, p in zip(picked, pc.on_rep.tolist())
        ]
        seen = torch.zeros_like(sub, dtype=torch.bool)
        seen.view(-1).index_fill_(0, _flat_index(seqs, vocab, dev), True)
        if pending is not None:
            seen.index_put_(pending, torch.ones_like(pending[0], dtype=torch.bool))
        sub = _repetition(sub, seen, pc.rep)
    counted: torch.Tensor | None = None
    if pc.presence is not None or pc.frequency is not None:
        counted = counts = torch.zeros_like(sub)
        drafted = any(map(_DRAFTS, picked))
        outs = list(map(_outputs, picked)) if drafted else list(map(_OUTPUT_IDS, picked))
        flat = _flat_index(outs, vocab, dev)
        counts.view(-1).index_add_(0, flat, torch.ones_like(flat, dtype=sub.dtype))
        if pending is not None:
            one = torch.ones_like(pending[0], dtype=sub.dtype)
            counts.index_put_(pending, one, accumulate=True)
    return _penalize(logits, sub, counted, pc, in_place)


def _penalize_in_one_op(
    logits: torch.Tensor,
    pend: list[int],
    at: torch.Tensor,
    pool: PenaltyCounts,
    pc: PenaltyColumns,
    op: PenalizeRows,
    prev_tokens: torch.Tensor | None,
    cols: DeviceColumns | None,
    in_place: bool,
    flags: int,
) -> torch.Tensor:
    """apply_penalties' kept-counts path in the device's one op (the same logits, bit for
    bit): `at`, the rows' entries of `pool`; pend, their pending_row; flags, the op's
    (the terms', and COMMIT where gather granted it)."""
    if prev_tokens is None:
        assert max(pend) < 0, "a pending token with no step in flight"
        prev_tokens = pc.rows[:0]
    out = logits if in_place and logits.stride(-1) == 1 else logits.clone()
    # kept as a list: its check against the last step's is a list compare, not numpy's
    pend_col = _column(cols, "penalty.pending", pend, logits.device, torch.long)
    op.fn(out, pc.rows, at, pool.counts, pool.seen, pend_col, prev_tokens, pc.nums, flags)
    return out


def _repetition(sub: torch.Tensor, seen: torch.Tensor, rep: torch.Tensor) -> torch.Tensor:
    """HF's repetition penalty where `seen`: a positive logit divided, a negative one
    multiplied (rep: each row's, [k])."""
    rep = rep[:, None]
    return torch.where(seen, torch.where(sub > 0, sub / rep, sub * rep), sub)


def _penalize(
    logits: torch.Tensor,
    sub: torch.Tensor,
    counts: torch.Tensor | None,
    pc: PenaltyColumns,
    in_place: bool = False,
) -> torch.Tensor:
    """Presence/frequency on the penalized rows' copy (where some row has one), put back
    (into `logits` itself where in_place)."""
    if counts is not None:
        if pc.presence is not None:
            sub = sub - pc.presence[:, None] * (counts > 0).to(sub.dtype)
        if pc.frequency is not None:
            sub = sub - pc.frequency[:, None] * counts
    return (logits if in_place else logits.clone()).index_copy_(0, pc.rows, sub)
