"""Rank 0 hands each step's inputs to the other ranks: one flat int64 tensor, broadcast.

    message   [kind, argmax_vocab (-1: none), form, length, payload ...]   int64
    form 0    a list of SeqInput: n, then per sequence (tokens, num_computed, table
              length, sample, prompt_logits, prev_row, slot, draft, verify), then every
              sequence's tokens, then every table
    form 1    DecodeRows: n, pad, width, then token_ids, positions, prev_rows, table
              lengths (n each) and the rows' tables [n, width] (gathered from the
              scheduler's BlockTables; a follower builds its own tables of those n rows)

The first broadcast is FIRST_WORDS long and carries the whole message when it fits (a
decode step of 32 rows with 16-block tables takes ~700 words): one collective a step;
a longer one (a long prompt) sends its remainder in a second. Not pickle: the followers
read integers into known fields. The same ranks run the same forward from it, so every
collective inside the model meets its peers in the same order.

Why a broadcast on the group rather than a second channel (shared memory, ZeroMQ): it
needs no other endpoint, and a dead or hung peer fails it as it fails the model's
collectives (the group's timeout); its cost a step is in docs/benchmarks.md.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

from scheduler_worker.backends.base import DecodeRows, SeqInput, StepInputs
from scheduler_worker.backends.block_tables import BlockTables
from scheduler_worker.parallel.group import TPGroup

FIRST_WORDS = 1024
HEADER = 4
# kinds of step
NOOP, STOP, EXECUTE, PROMPT_LOGITS = 0, 1, 2, 3
SEQ_FIELDS = 9


def encode(kind: int, seqs: StepInputs | None, argmax_vocab: int | None) -> np.ndarray:
    argmax = -1 if argmax_vocab is None else argmax_vocab
    if seqs is None:
        return np.array([kind, argmax, 0, 0], dtype=np.int64)
    if isinstance(seqs, DecodeRows):
        idx = np.asarray(seqs.slots, dtype=np.int64)
        lengths = seqs.tables.lengths[idx].astype(np.int64)
        width = max(1, int(lengths.max()) if len(idx) else 1)
        have = min(width, seqs.tables.width)
        tables = np.full((len(idx), width), seqs.tables.pad, dtype=np.int64)
        tables[:, :have] = seqs.tables.array[idx, :have]
        n = len(idx)
        body = [
            np.array([n, seqs.tables.pad, width], dtype=np.int64),
            np.asarray(seqs.token_ids, dtype=np.int64),
            np.asarray(seqs.positions, dtype=np.int64),
            np.asarray(seqs.prev_rows, dtype=np.int64),
            lengths,
            tables.ravel(),
        ]
        form = 1
    else:
        heads = [
            (
                len(s.token_ids),
                s.num_computed,
                len(s.block_table),
                s.sample,
                s.prompt_logits,
                s.prev_row,
                s.slot,
                s.draft,
                s.verify,
            )
            for s in seqs
        ]
        body = [
            np.array([len(seqs)], dtype=np.int64),
            np.array(heads, dtype=np.int64).ravel(),
            np.fromiter((t for s in seqs for t in s.token_ids), dtype=np.int64),
            np.fromiter((b for s in seqs for b in s.block_table), dtype=np.int64),
        ]
        form = 0
    payload = np.concatenate(body)
    return np.concatenate([np.array([kind, argmax, form, len(payload)], np.int64), payload])


@dataclass
class Step:
    kind: int
    seqs: StepInputs | None
    argmax_vocab: int | None


def decode(message: np.ndarray) -> Step:
    kind, argmax, form, length = (int(v) for v in message[:HEADER])
    vocab = None if argmax < 0 else argmax
    if length == 0:
        return Step(kind, None, vocab)
    p = message[HEADER : HEADER + length]
    if form == 1:
        n, pad, width = (int(v) for v in p[:3])
        cols = [p[3 + i * n : 3 + (i + 1) * n] for i in range(4)]
        tables = BlockTables(n, pad, width=width)
        tables.array[:] = p[3 + 4 * n : 3 + 4 * n + n * width].reshape(n, width)
        tables.lengths[:] = cols[3]
        ids, pos, prev = (c.tolist() for c in cols[:3])
        return Step(kind, DecodeRows(ids, pos, list(range(n)), prev, tables), vocab)
    n = int(p[0])
    heads = p[1 : 1 + n * SEQ_FIELDS].reshape(n, SEQ_FIELDS).tolist()
    words = p[1 + n * SEQ_FIELDS :].tolist()  # every sequence's tokens, then every table
    at, table_at = 0, sum(h[0] for h in heads)
    out: list[SeqInput] = []
    for ntok, computed, ntable, sample, logits, prev, slot, draft, verify in heads:
        ids, table = words[at : at + ntok], words[table_at : table_at + ntable]
        at, table_at = at + ntok, table_at + ntable
        flags = bool(sample), logits, prev, slot, bool(draft), bool(verify)
        out.append(SeqInput(ids, computed, table, *flags))
    return Step(kind, out, vocab)


class StepChannel:
    """Rank 0's `send` and the followers' `receive`, over the group's broadcasts."""

    def __init__(self, group: TPGroup) -> None:
        self.group = group
        self.first = torch.zeros(FIRST_WORDS, dtype=torch.int64, device=group.device)
        self.broadcasts = 0  # counted, and timed (encoding included): docs/benchmarks.md
        self.send_s = 0.0

    def send(self, kind: int, seqs: StepInputs | None = None, vocab: int | None = None) -> None:
        t0 = time.perf_counter()
        self._broadcast(encode(kind, seqs, vocab))
        self.send_s += time.perf_counter() - t0

    def _broadcast(self, message: np.ndarray) -> None:
        head = min(len(message), FIRST_WORDS)
        self.first[:head].copy_(torch.from_numpy(message[:head]))
        self.group.broadcast(self.first)
        self.broadcasts += 1
        if len(message) > FIRST_WORDS:
            rest = torch.from_numpy(message[FIRST_WORDS:]).to(self.group.device)
            self.group.broadcast(rest)
            self.broadcasts += 1

    def receive(self) -> Step:
        self.group.broadcast(self.first)
        first = self.first.cpu().numpy()
        total = HEADER + int(first[3])
        if total <= FIRST_WORDS:
            return decode(first[:total].copy())
        rest = torch.empty(total - FIRST_WORDS, dtype=torch.int64, device=self.group.device)
        self.group.broadcast(rest)
        return decode(np.concatenate([first, rest.cpu().numpy()]))
