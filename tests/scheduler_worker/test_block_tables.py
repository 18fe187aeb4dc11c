"""The scheduler's persistent block tables (backends/block_tables.py): a row per running
request, kept equal to its block_table through admission, growth, preemption, sliding-window
frees and finish; and the decode staging gathers the same inputs from them as from the
rows' lists."""

from __future__ import annotations

import random

import pytest
import torch

from common.config import CacheConfig, SchedulerConfig
from common.sampling_params import SamplingParams
from scheduler_worker.backends.base import DecodeRows, SeqInput
from scheduler_worker.backends.block_tables import BlockTables
from scheduler_worker.backends.cpu import CpuBackend
from scheduler_worker.backends.graphs import StaticDecodeInputs
from scheduler_worker.quant.linear import StepRows
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
    t.append([b, a], [8, 3])  # a block more for each, in one write
    t.append([b], [9])
    assert t.row(a) == [5, 99, 7, 3] and t.row(b) == [8, 9]
    t.append([a], [4])  # a's fifth: the width doubles
    assert t.width == 8 and t.row(a) == [5, 99, 7, 3, 4] and t.row(b) == [8, 9]
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


def _rows(rng: random.Random, n: int, bs: int, scratch: int):
    """n decode rows two ways: SeqInputs with their own lists, and DecodeRows over the
    tables the scheduler would keep (a table for each, in slots taken in some order)."""
    tables = BlockTables(2 * n, pad=scratch)
    for _ in range(n):  # slots not 0..n-1: some taken and given back first
        tables.take()
    for s in range(0, n, 2):
        tables.give(s)
    seqs = []
    for i in range(n):
        pos = rng.randrange(0, 60)
        blocks = rng.sample(range(scratch), pos // bs + 1 + rng.randrange(0, 2))
        slot = tables.take()
        tables.write(slot, 0, blocks)
        prev = rng.choice([-1, i])
        seqs.append(SeqInput([-1 if prev >= 0 else 9], pos, blocks, True, 0, prev, slot))
    rows = DecodeRows(
        [s.token_ids[0] for s in seqs],
        [s.num_computed for s in seqs],
        [s.slot for s in seqs],
        [s.prev_row for s in seqs],
        tables,
    )
    return seqs, rows


def test_decode_staging_from_tables_equals_from_lists():
    rng = random.Random(3)
    bs, n, scratch = 4, 12, 500
    seqs, rows = _rows(rng, n, bs, scratch)
    assert [s.block_table for s in rows.seqs()] == [s.block_table for s in seqs]
    prev_tokens = torch.arange(100, 100 + n)
    staged = []
    for step in (rows, seqs):
        inp = StaticDecodeInputs(16, 32, torch.device("cpu"), scratch, bs)
        inp.fill(step, 16, prev_tokens)
        staged.append([x.clone() for x in (inp.ids, inp.pos, inp.slots, inp.ctx, inp.tables)])
        w = max(s.num_computed for s in seqs) // bs + 1
        for s, row in zip(seqs, inp.tables[:n, :w].tolist()):
            k = s.num_computed // bs + 1  # a row's own blocks; the rest no kernel reads
            assert row[:k] == s.block_table[:k]
            assert row[len(s.block_table) :] == [scratch] * (w - len(s.block_table))
    for a, b in zip(*staged):
        torch.testing.assert_close(a, b)
    ids = staged[0][0][:n].tolist()
    assert ids == [100 + i if s.prev_row >= 0 else 9 for i, s in enumerate(seqs)]
    pos = staged[0][1][:n].tolist()
    slots = staged[0][2][:n].tolist()
    assert slots == [s.block_table[p // bs] * bs + p % bs for s, p in zip(seqs, pos)]


def test_static_tables_are_copied_again_only_after_a_write():
    """A step of the same rows in the same order, no table written since, stages only the
    token columns (the static tables hold them: most overlapped steps); a write, another
    order or another graph size copies them again. Slots are right either way."""
    rng = random.Random(4)
    bs, n, scratch = 4, 6, 500
    _, rows = _rows(rng, n, bs, scratch)
    inp = StaticDecodeInputs(8, 32, torch.device("cpu"), scratch, bs)

    def want_slots(r: DecodeRows) -> list[int]:
        return [r.tables.row(s)[p // bs] * bs + p % bs for s, p in zip(r.slots, r.positions)]

    prev = torch.arange(100, 100 + n)  # the step in flight's tokens (rows with placeholders)
    inp.fill(rows, 8, prev)
    first = inp.tables.clone()
    inp.tables[0, 0] = -7  # a mark a copy would overwrite
    rows.positions = [p - p % bs for p in rows.positions]  # within the same blocks
    inp.fill(rows, 8, prev)
    assert inp.tables[0, 0] == -7 and inp.slots[:n].tolist() == want_slots(rows)
    rows.tables.append([rows.slots[0]], [321])  # a row's new block: written, so copied
    inp.fill(rows, 8, prev)
    assert inp.tables[0, 0] == first[0, 0] and 321 in inp.tables[0].tolist()
    inp.tables[0, 0] = -7
    swapped = DecodeRows(
        rows.token_ids, rows.positions[::-1], rows.slots[::-1], rows.prev_rows, rows.tables
    )
    inp.fill(swapped, 8, prev)  # another order: copied
    assert inp.tables[n - 1, 0] == first[0, 0] and inp.slots[:n].tolist() == want_slots(swapped)
    inp.tables[0, 0] = -7
    inp.fill(swapped, 6, prev)  # another graph size: copied
    assert inp.tables[0, 0] != -7


def test_cpu_decode_inputs_from_rows_equal_those_from_seq_inputs():
    rng = random.Random(4)
    bs, n, scratch = 4, 9, 300
    seqs, rows = _rows(rng, n, bs, scratch)
    backend = CpuBackend(torch.float32, bs, None, StepRows())
    backend.prev_tokens = torch.arange(50, 50 + n)
    got = []
    for step in (rows, seqs):
        ids, pos, meta = backend.prepare(step)
        w = meta.decode_block_tables.shape[1]
        assert w >= max(s.num_computed for s in seqs) // bs + 1
        got.append(
            [ids.clone(), pos.clone(), meta.slot_mapping.clone(), meta.decode_context_lens.clone()]
        )
        for s, row in zip(seqs, meta.decode_block_tables.tolist()):
            k = s.num_computed // bs + 1
            assert row[:k] == s.block_table[:k]
    for a, b in zip(*got):
        torch.testing.assert_close(a, b)
    assert got[0][0].tolist() == [50 + i if s.prev_row >= 0 else 9 for i, s in enumerate(seqs)]


def test_a_table_that_does_not_cover_the_token_is_refused():
    tables = BlockTables(2, pad=0)
    slot = tables.take()
    tables.write(slot, 0, [3])
    rows = DecodeRows([1], [4], [slot], [-1], tables)  # position 4: a second block of 4
    with pytest.raises(ValueError, match="does not cover"):
        rows.staged(4, 2)
