"""Scheduler policy without a model: admission, budgets, and bounded per-step work."""

from __future__ import annotations

from common.config import CacheConfig, SchedulerConfig
from common.sampling_params import SamplingParams
from scheduler_worker.request import Request, RequestStatus
from scheduler_worker.scheduler import Scheduler


def _scheduler(num_blocks=1024, **kw) -> Scheduler:
    sched = SchedulerConfig(**{"max_num_seqs": 16, "max_num_batched_tokens": 64, **kw})
    return Scheduler(sched, CacheConfig(block_size=4), num_blocks, max_model_len=4096)


def _step(s: Scheduler, max_tokens: dict[str, int]) -> set[str]:
    """Stand-in for the engine's update: advance, append a token, finish or requeue."""
    batch = s.schedule()
    finished = set()
    for req, n in list(batch.entries.values()):
        s.advance(req, n)
        if req.num_computed_tokens == req.num_tokens:
            req.append_token(7)
            if req.num_output_tokens >= max_tokens[req.request_id]:
                s.finish(req, RequestStatus.FINISHED_LENGTH)
                finished.add(req.request_id)
            else:
                s.requeue(req)
    return finished


def test_per_step_work_does_not_grow_with_finished_requests():
    s = _scheduler(max_num_seqs=64, max_num_batched_tokens=256)
    max_tokens = {}
    done = 0
    for wave in range(100):  # 10,000 requests come and go
        for i in range(100):
            rid = f"{wave}-{i}"
            max_tokens[rid] = 1 + i % 3
            s.add(Request(rid, [1, 2, 3, 4, 5], SamplingParams(max_tokens=max_tokens[rid])))
        while s.live or s.num_waiting:
            done += len(_step(s, max_tokens))
    assert done == 10_000
    s.blocks.check_integrity()
    # now a few long-running requests: each step touches only them
    for i in range(5):
        max_tokens[f"live{i}"] = 1000
        s.add(Request(f"live{i}", [1, 2, 3], SamplingParams(max_tokens=1000)))
    _step(s, max_tokens)
    visits = []
    for _ in range(20):
        before = s.num_visited
        _step(s, max_tokens)
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
    max_tokens = {}
    for i in range(6):
        max_tokens[f"r{i}"] = 100
        s.add(Request(f"r{i}", [1, 2], SamplingParams(max_tokens=100)))
    _step(s, max_tokens)  # all six prefill together
    seen = []
    for _ in range(6):
        batch = s.schedule()
        seen.append(sorted(batch.entries))
        for req, n in batch.entries.values():
            s.advance(req, n)
            req.append_token(7)
            s.requeue(req)
    assert all(len(b) == 2 for b in seen)
    counts = {rid: sum(rid in b for b in seen) for rid in max_tokens}
    assert set(counts.values()) == {2}, counts  # every stream served equally often
