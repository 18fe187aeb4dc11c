"""A step as the GPU's varlen kernels read it (triton_prefill.py), written once for the
eager steps (cuda.py's prepare) and the mixed-step graphs' staging (mixed_graphs.py):

    per token, in the step's order (decodes first): id (a placeholder as 0), position,
        cache slot, and its row in the step in flight (-1: its id is known)
    per sequence, in that order: its first token (query start), its context after the
        step, its block table cut to the tables' width
    the sampled rows: each sampling sequence's last token, in the order of `seqs`
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from scheduler_worker.backends.base import SeqInput, step_order


@dataclass(slots=True)
class VarlenColumns:
    """Where the columns go: int64 arrays of at least the step's tokens (ids, positions,
    slots, prev) and sequences (query_start: one more, context_lens, sampled_rows,
    tables [seqs, width]). What the step does not cover keeps the caller's values
    (a graph's padding, a table's filler block)."""

    ids: np.ndarray
    positions: np.ndarray
    slots: np.ndarray
    prev: np.ndarray
    query_start: np.ndarray
    context_lens: np.ndarray
    sampled_rows: np.ndarray
    tables: np.ndarray


def write_varlen(seqs: list[SeqInput], block_size: int, out: VarlenColumns) -> tuple[int, int]:
    """Write `seqs` into `out`; returns (tokens, sampled rows). ValueError where a block
    table does not cover its tokens (SeqInput.slots)."""
    width = out.tables.shape[1]
    starts = [0] * len(seqs)
    n = 0
    for k, i in enumerate(step_order(seqs)):
        q = seqs[i]
        m, p = len(q.token_ids), q.num_computed
        starts[i] = n
        out.ids[n : n + m] = [max(x, 0) for x in q.token_ids]
        out.positions[n : n + m] = range(p, p + m)
        out.slots[n : n + m] = q.slots(block_size)
        out.prev[n : n + m] = -1
        out.prev[n] = q.prev_row
        out.query_start[k] = n
        out.context_lens[k] = p + m
        table = q.block_table[:width]
        out.tables[k, : len(table)] = table
        n += m
    out.query_start[len(seqs)] = n
    sampled = 0
    for i, q in enumerate(seqs):
        if q.sample:
            out.sampled_rows[sampled] = starts[i] + len(q.token_ids) - 1
            sampled += 1
    return n, sampled
