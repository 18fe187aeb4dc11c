"""Scheduler policy without a model: admission, budgets, and bounded per-step work."""

from __future__ import annotations

from common.config import CacheConfig, SchedulerConfig
from common.sampling_params import SamplingParams
from scheduler_worker.request import Request, RequestStatus
from scheduler_worker.scheduled_batch import ScheduledBatch
from scheduler_worker.scheduler import Scheduler


def _scheduler(num_blocks=1024, **kw) -> Scheduler:
    sched = SchedulerConfig(**{"max_num_seqs": 16, "max_num_batched_tokens": 64, **kw})
    return Scheduler(sched, CacheConfig(block_size=4), num_blocks, eos_token_ids=[0])


def _step(s: Scheduler) -> set[str]:
    """One engine step without a model: every request that samples gets token 7.
    Returns the ids of the requests that finished."""
    batch = s.schedule()
    sampled = s.update(batch, [7] * sum(batch.sampling()))
    return {req.request_id for req in sampled if req.status.finished}


def test_per_step_work_does_not_grow_with_finished_requests():
    s = _scheduler(max_num_seqs=64, max_num_batched_tokens=256)
    done = 0
    for wave in range(100):  # 10,000 requests come and go
        for i in range(100):
            s.add(Request(f"{wave}-{i}", [1, 2, 3, 4, 5], SamplingParams(max_tokens=1 + i % 3)))
        while s.live or s.num_waiting:
            done += len(_step(s))
    assert done == 10_000
    s.blocks.check_integrity()
    # now a few long-running requests: each step touches only them
    for i in range(5):
        s.add(Request(f"live{i}", [1, 2, 3], SamplingParams(max_tokens=1000)))
    _step(s)
    visits = []
    for _ in range(20):
        before = s.num_visited
        _step(s)
        visits.append(s.num_visited - before)
    assert max(visits) <= 5, visits


def test_admission_respects_budget_seq_limit_and_blocks():
    s = _scheduler(num_blocks=10, max_num_seqs=3, max_num_batched_tokens=20)
    for i in range(5):
        s.add(Request(f"r{i}", list(range(1, 9)), SamplingParams(max_tokens=4)))
    batch = s.schedule()
    # 8-token prompts, 20-token budget: two whole prompts and a 4-token chunk of a third
    assert [n for _, n in batch.entries.values()] == [8, 8, 4]
    assert s.num_running == 3 and s.num_waiting == 2
    assert s.blocks.num_used_blocks == 2 + 2 + 1
    s.blocks.check_integrity()


def test_round_robin_over_active_queue():
    s = _scheduler(max_num_seqs=6, max_decode_batch=2, max_num_batched_tokens=64)
    rids = [f"r{i}" for i in range(6)]
    for rid in rids:
        s.add(Request(rid, [1, 2], SamplingParams(max_tokens=100)))
    _step(s)  # all six prefill together
    seen = []
    for _ in range(6):
        batch = s.schedule()
        seen.append(sorted(batch.entries))
        s.update(batch, [7] * len(batch))
    assert all(len(b) == 2 for b in seen)
    counts = {rid: sum(rid in b for b in seen) for rid in rids}
    assert set(counts.values()) == {2}, counts  # every stream served equally often


def test_update_finishes_on_stop_tokens_then_max_tokens():
    """EOS (unless ignore_eos) and stop_token_ids stop a request once min_tokens are out;
    max_tokens ends it otherwise. A finished request frees its blocks at once."""
    s = _scheduler()
    params = {
        "eos": SamplingParams(max_tokens=5),
        "ignore-eos": SamplingParams(max_tokens=3, ignore_eos=True),
        "stop-id": SamplingParams(max_tokens=5, stop_token_ids=[9]),
        "min-tokens": SamplingParams(max_tokens=5, min_tokens=2),
    }
    for rid, p in params.items():
        s.add(Request(rid, [1, 2, 3], p))
    tokens = {"eos": [0], "ignore-eos": [0, 0, 0], "stop-id": [4, 9], "min-tokens": [0, 0]}
    finished: dict[str, Request] = {}
    for step in range(3):
        batch = s.schedule()
        sampled = s.update(batch, [tokens[r.request_id][step] for r, _ in batch.entries.values()])
        assert [r.request_id for r in sampled] == list(batch.entries)
        finished.update((r.request_id, r) for r in sampled if r.status.finished)
    assert {
        rid: (r.status, r.output_token_ids, r.stop_token_id) for rid, r in finished.items()
    } == {
        "eos": (RequestStatus.FINISHED_STOPPED, [0], None),
        "ignore-eos": (RequestStatus.FINISHED_LENGTH, [0, 0, 0], None),
        "stop-id": (RequestStatus.FINISHED_STOPPED, [4, 9], 9),
        "min-tokens": (RequestStatus.FINISHED_STOPPED, [0, 0], None),
    }
    assert all(r.first_token_time is not None and not r.block_table for r in finished.values())
    assert s.num_running == 0 and s.blocks.num_used_blocks == 0
    s.blocks.check_integrity()


def test_a_dropped_entry_takes_its_count_and_sampling_stays_right():
    """ScheduledBatch.drop (a deferred row, a row finished by the step in flight): the
    decode and prompt-token counts follow, so sampling() still marks only the rows that
    reach their last token, decodes first."""
    s = _scheduler(max_num_seqs=8, max_num_batched_tokens=64)
    for i in range(3):
        s.add(Request(f"d{i}", [1, 2, 3], SamplingParams(max_tokens=50)))
    _step(s)  # three prompts in: now decoding
    s.add(Request("p", list(range(1, 40)), SamplingParams(max_tokens=5)))
    batch = s.schedule()
    assert batch.num_decode == 3 and batch.num_prefill_tokens == 39 - 0
    d1 = batch.entries["d1"][0]
    assert batch.drop(d1) and not batch.drop(d1)
    assert batch.num_decode == 2 and batch.sampling() == [True, True, True]
    assert batch.drop(batch.entries["p"][0])  # the prompt: its tokens, not a decode
    assert batch.num_decode == 2 and batch.num_prefill_tokens == 0
    only = ScheduledBatch({r: (req, 1) for r, (req, _) in batch.entries.items()}, num_decode=2)
    assert only.drop(batch.entries["d2"][0])  # every entry a decode: no look for its place
    assert only.num_decode == 1 and only.sampling() == [True]
    small = _scheduler(max_num_seqs=8, max_num_batched_tokens=6)
    small.add(Request("long", list(range(1, 30)), SamplingParams(max_tokens=5)))
    chunk = small.schedule()  # a mid-prompt chunk: no sample
    assert chunk.sampling() == [False] and chunk.drop(chunk.entries["long"][0])
    assert chunk.num_prefill_tokens == 0 and chunk.num_decode == 0


def test_the_grammar_rows_that_wait_are_looked_up_by_id_in_the_step_in_flights_order():
    """ScheduledBatch.grammar_waits: of the constrained ids, the rows in the batch with a
    token in flight, in their order in the step in flight; an id not in the batch (sitting
    out, not scheduled) and a row with no token in flight are left out."""
    reqs = {f"r{i}": Request(f"r{i}", [1, 2], SamplingParams(max_tokens=8)) for i in range(6)}
    for rid, pending, row in [("r0", 1, 4), ("r1", 0, 0), ("r2", 1, 1), ("r3", 1, 3)]:
        reqs[rid].num_pending, reqs[rid].flight_row = pending, row
    batch = ScheduledBatch({rid: (reqs[rid], 1) for rid in ("r0", "r1", "r2", "r4")}, 4)
    assert batch.grammar_waits(["r0", "r1", "r2", "r3", "r5"]) == [reqs["r2"], reqs["r0"]]
    assert batch.grammar_waits(["r3", "r1"]) == [] and batch.grammar_waits([]) == []
