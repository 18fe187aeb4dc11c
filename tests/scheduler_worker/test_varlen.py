"""The varlen columns of a step (backends/varlen.py), which the GPU's eager steps and its
mixed-step graphs both stage: a small step worked out by hand."""

from __future__ import annotations

import numpy as np

from scheduler_worker.backends.base import SeqInput
from scheduler_worker.backends.varlen import VarlenColumns, write_varlen

PAD, FILLER = -5, 99


def columns(tokens: int, seqs: int, width: int) -> VarlenColumns:
    def col(n: int) -> np.ndarray:
        return np.full(n, PAD, dtype=np.int64)

    tables = np.full((seqs, width), FILLER, dtype=np.int64)
    return VarlenColumns(
        col(tokens), col(tokens), col(tokens), col(tokens),
        col(seqs + 1), col(seqs), col(seqs), tables,
    )  # fmt: skip


def test_a_step_in_the_step_order_with_its_sampled_rows_in_the_order_of_the_seqs():
    seqs = [
        SeqInput([5, 6, 7], 2, [3, 4]),  # a prompt's chunk at positions 2..4, sampled
        SeqInput([-1], 6, [1, 2], prev_row=3),  # a decode whose token is still in flight
        SeqInput([9, 9], 0, [7, 8, 9], sample=False),  # a first chunk; its table is wider
    ]
    out = columns(8, 4, 2)  # room for 8 tokens, 4 sequences: the rest is the caller's
    assert write_varlen(seqs, 4, out) == (6, 2)
    # the decode first (step_order), its placeholder as token 0, its row in flight kept
    assert out.ids.tolist() == [0, 5, 6, 7, 9, 9, PAD, PAD]
    assert out.positions.tolist() == [6, 2, 3, 4, 0, 1, PAD, PAD]
    assert out.slots.tolist() == [2 * 4 + 2, 14, 15, 16, 28, 29, PAD, PAD]
    assert out.prev.tolist() == [3, -1, -1, -1, -1, -1, PAD, PAD]
    assert out.query_start.tolist() == [0, 1, 4, 6, PAD]
    assert out.context_lens.tolist() == [7, 5, 2, PAD]
    assert out.tables.tolist() == [[1, 2], [3, 4], [7, 8], [FILLER, FILLER]]
    # the prompt's last token (row 3), then the decode's (row 0); the chunk samples none
    assert out.sampled_rows.tolist()[:2] == [3, 0]


def test_a_table_shorter_than_the_width_keeps_the_filler_past_its_blocks():
    out = columns(1, 1, 3)
    assert write_varlen([SeqInput([4], 1, [6])], 4, out) == (1, 1)
    assert out.tables.tolist() == [[6, FILLER, FILLER]] and out.slots.tolist() == [25]
    assert out.query_start.tolist() == [0, 1] and out.prev.tolist() == [-1]
