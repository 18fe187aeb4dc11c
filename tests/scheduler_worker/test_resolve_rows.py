"""scheduler_worker.resolve_rows: the common row resolved inline, as Scheduler.resolve and
the engine's output would; every other row handed to `other`, in its place."""

from __future__ import annotations

from common.config import CacheConfig, SchedulerConfig
from common.sampling_params import SamplingParams
from scheduler_worker.request import Request, RequestStatus
from scheduler_worker.resolve_rows import resolve_rows
from scheduler_worker.scheduler import Scheduler
from scheduler_worker.step_output import RequestOutput

EOS = 2


def _scheduler() -> Scheduler:
    config = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=256)
    return Scheduler(config, CacheConfig(block_size=4), 64, eos_token_ids=[EOS])


def _running(sched: Scheduler, rid: str, **kw) -> Request:
    req = Request(rid, list(range(10, 30)), SamplingParams(max_tokens=8, **kw))
    sched.add(req)
    return req


def test_common_rows_inline_and_the_others_in_their_place():
    sched = _scheduler()
    plain = _running(sched, "plain")
    stops = _running(sched, "stops")
    penalized = _running(sched, "pen", presence_penalty=0.5)
    first = _running(sched, "first")
    batch = sched.schedule()
    sampled = sched.advance(batch)  # each prompt done: a placeholder each
    for r in (plain, stops, penalized):
        r.first_token_time = 1.0  # not their first token
    seen: list[str] = []

    def other(req, index, token, lp):
        seen.append(req.request_id)
        sched.resolve(req, index, token)
        return None

    outputs = resolve_rows(sched, sampled, [5, EOS, 6, 7], [None] * 4, {}, other)
    assert seen == ["stops", "pen", "first"]  # a stop token, a history reader, a first token
    # the output a RequestOutput built field by field would be (the inline one is a tuple)
    assert outputs == [RequestOutput("plain", [5], None, None, 20, 1, 0)]
    assert plain.output_token_ids == [5] and plain.num_pending == 0
    assert plain.token_ids[-1] == 5 and plain.status is RequestStatus.RUNNING
    assert stops.status is RequestStatus.FINISHED_STOPPED
    assert first.output_token_ids == [7] and first.first_token_time is not None
    # the blocks the known tokens fill are hashed, as resolve() would
    assert plain.num_hashed_blocks == 20 // 4 and sched.blocks.check_integrity() is None


def test_the_last_token_and_a_drafted_row_go_to_other():
    sched = _scheduler()
    last = _running(sched, "last")
    drafted = _running(sched, "drafted")
    sampled = sched.advance(sched.schedule())
    last.max_tokens = 1  # this token is its last
    last.first_token_time = drafted.first_token_time = 1.0
    seen: list[str] = []

    def other(req, index, token, lp):
        seen.append(req.request_id)
        sched.resolve(req, index, token)
        return None

    resolve_rows(sched, sampled, [5, 6], [None, None], {"drafted": ([1], [1])}, other)
    assert seen == ["last", "drafted"] and last.status is RequestStatus.FINISHED_LENGTH
