"""The scheduler's persistent block tables (backends/block_tables.py): a row per running
request, kept equal to its block_table through admission, growth, preemption, sliding-window
frees and finish; and the decode staging gathers the same inputs from them as from the
rows' lists."""

from __future__ import annotations

import random

import numpy as np
import torch

from common.config import CacheConfig, SchedulerConfig
from common.sampling_params import SamplingParams
from scheduler_worker.backends.base import SeqInput
from scheduler_worker.backends.block_tables import BlockTables
from scheduler_worker.backends.graphs import COLS, StaticDecodeInputs
from scheduler_worker.request import Request
from scheduler_worker.scheduler import Scheduler


def test_slots_rows_and_growth():
    t = BlockTables(3, pad=99, width=2)
    a, b = t.take(), t.take()
    assert (a, b) == (0, 1)
    t.write(a, 0, [5, 6, 7])  # past the width: it doubles
    assert t.width == 4 and t.row(a) == [5, 6, 7] and t.row(b) == []
    t.write(a, 1, [99])  # a window's block given back: in place, the length kept
    assert t.row(a) == [5, 99, 7]
    t.give(a)
    assert t.row(a) == [] and (t.array[a] == 99).all()
    assert t.take() == a  # the freed slot comes back first


def _check(s: Scheduler) -> None:
    slots = [r.slot for r in s.live.values()]
    assert len(set(slots)) == len(slots) and min(slots, default=0) >= 0
    for r in s.live.values():
        assert s.tables.row(r.slot) == r.block_table, r.request_id
    assert len(s.tables._free) + len(slots) == s.tables.array.shape[0]


def _run(s: Scheduler, steps: int, rng: random.Random) -> None:
    n = 0
    for _ in range(steps):
        if rng.random() < 0.7:
            prompt = [rng.randrange(1, 50) for _ in range(rng.randrange(1, 30))]
            s.add(Request(f"r{n}", prompt, SamplingParams(max_tokens=rng.randrange(1, 60))))
            n += 1
        batch = s.schedule()
        _check(s)
        s.update(batch, [0 if rng.random() < 0.02 else 7 for _ in range(sum(batch.sampling()))])
        _check(s)
        for r in list(s.live.values()):
            assert r.slot >= 0
    s.blocks.check_integrity()


def test_tables_follow_block_tables_through_preemption_and_finish():
    sched = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=32)
    s = Scheduler(sched, CacheConfig(block_size=4), 40, eos_token_ids=[0])  # preempts often
    _run(s, 400, random.Random(1))
    assert s.num_preemptions > 0


def test_tables_follow_a_sliding_window():
    sched = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=16)
    s = Scheduler(sched, CacheConfig(block_size=4), 200, sliding_window=8)
    _run(s, 300, random.Random(2))


def test_decode_staging_from_tables_equals_from_lists():
    rng = random.Random(3)
    bs, n, scratch = 4, 12, 500
    tables = BlockTables(16, pad=scratch)
    seqs = []
    for i in range(n):
        pos = rng.randrange(0, 60)
        blocks = rng.sample(range(scratch), pos // bs + 1 + rng.randrange(0, 2))
        slot = tables.take()
        tables.write(slot, 0, blocks)
        prev = rng.choice([-1, i])
        seqs.append(SeqInput([-1 if prev >= 0 else 9], pos, blocks, True, 0, prev, slot))
    prev_tokens = torch.arange(100, 100 + n)
    staged = []
    for t in (tables, None):
        inp = StaticDecodeInputs(16, 32, torch.device("cpu"), False, scratch, bs)
        inp.fill(seqs, 16, prev_tokens, t)
        staged.append([x.clone() for x in (inp.ids, inp.pos, inp.slots, inp.ctx)])
        w = max(s.num_computed for s in seqs) // bs + 1
        tab = inp.tables[:n, :w]
        for s, row in zip(seqs, tab.tolist()):  # a row's own blocks; the rest no kernel reads
            k = s.num_computed // bs + 1
            assert row[:k] == s.block_table[:k]
    for a, b in zip(*staged):
        torch.testing.assert_close(a, b)
    ids = staged[0][0][:n].tolist()
    assert ids == [100 + i if s.prev_row >= 0 else 9 for i, s in enumerate(seqs)]
    assert COLS == 5 and np.int32 == tables.array.dtype
