"""scheduler_worker.decode_batch: the decode batch kept between steps gives the batches,
row for row and in order, and the tokens that taking every row afresh each step gives,
whatever joins, finishes, is aborted, preempted or deferred, in any order."""

from __future__ import annotations

import random

import pytest

import scheduler_worker.scheduler as scheduler_module
from common.config import CacheConfig, SchedulerConfig
from common.sampling_params import SamplingParams
from scheduler_worker.request import Request, RequestStatus
from scheduler_worker.scheduler import Scheduler

EOS = 0


def _token(rid: str, index: int) -> int:
    """The token a request samples at index: fixed by (request, index), so that both
    runs sample the same tokens; EOS about one time in 29."""
    return (int(rid[1:]) * 7919 + index * 104729) % 29


def inline_as_its_fields(req: Request) -> bool:
    """Request.resolves_inline, kept by the scheduler, is what it stands for."""
    running = req.status is RequestStatus.RUNNING
    return req.resolves_inline == (
        running and not req.resolves_apart and req.first_token_time is not None
    )


def _run(
    seed: int, overlap: bool, kept: bool, decode_batch: int, monkeypatch
) -> tuple[list, dict, Scheduler]:
    """300 steps of random traffic over a small KV pool (preemptions); each step's
    entries, decode rows and prompt tokens, and every request's tokens at the end.
    decode_batch < 8: steps with more rows go row by row, round-robin, between kept ones."""
    taken = [0]
    real = scheduler_module.take_decodes

    def take(*args):
        got = real(*args) if kept else None
        taken[0] += got is not None
        return got

    monkeypatch.setattr(scheduler_module, "take_decodes", take)
    s = Scheduler(
        SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=24, max_decode_batch=decode_batch),
        CacheConfig(block_size=4),
        num_blocks=20,
        eos_token_ids=[EOS],
    )
    rng, log, reqs, in_flight = random.Random(seed), [], {}, None
    for _ in range(300):
        if rng.random() < 0.35:
            rid = f"r{len(reqs)}"
            prompt = [rng.randrange(1, 29) for _ in range(rng.randrange(1, 12))]
            params = SamplingParams(max_tokens=rng.randrange(1, 24), ignore_eos=rng.random() < 0.3)
            reqs[rid] = Request(rid, prompt, params)
            s.add(reqs[rid])
        live = sorted(s.live)
        if live and rng.random() < 0.05:
            s.finish(reqs[rng.choice(live)], RequestStatus.FINISHED_ABORTED)
        batch = s.schedule()
        log.append(([(rid, n) for rid, (_, n) in batch.entries.items()], batch.num_decode))
        log.append(batch.num_prefill_tokens)
        sampled = s.advance(batch)
        if in_flight is not None:
            for req, index in in_flight:
                s.resolve(req, index, _token(req.request_id, index))
        in_flight = sampled
        if not overlap:
            for req, index in in_flight:
                s.resolve(req, index, _token(req.request_id, index))
            in_flight = None
        s.blocks.check_integrity()
        for req in s.live.values():  # the per-slot tables agree with the requests'
            assert s.tables.row(req.slot) == req.block_table
        assert all(map(inline_as_its_fields, reqs.values()))
    outputs = {rid: (r.output_token_ids, r.status) for rid, r in reqs.items()}
    log.append(taken[0] > 50)  # steps that took the kept batch
    return log, outputs, s


@pytest.mark.parametrize("decode_batch", [8, 5])
@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_kept_batch_gives_the_same_batches_and_tokens_as_one_taken_afresh(
    seed, overlap, decode_batch, monkeypatch
):
    kept_log, kept_out, kept = _run(seed, overlap, True, decode_batch, monkeypatch)
    fresh_log, fresh_out, fresh = _run(seed, overlap, False, decode_batch, monkeypatch)
    assert kept_log[:-1] == fresh_log[:-1]
    assert kept_log[-1] and not fresh_log[-1]
    assert kept_out == fresh_out
    assert kept.num_preemptions == fresh.num_preemptions > 0  # blocks ran out
    assert any(status is RequestStatus.FINISHED_STOPPED for _, status in kept_out.values())
    assert sum(n for batch in kept_log[:-1:2] for _, n in batch[0]) > 500  # rows decoded


def test_rows_that_stop_running_leave_the_batch_at_once():
    """A finished, aborted or preempted request is no longer in the decode batch (no
    stale entry to skip later); one that joins comes last."""
    s = Scheduler(
        SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=64),
        CacheConfig(block_size=4),
        num_blocks=64,
        eos_token_ids=[EOS],
    )
    reqs = [Request(f"r{i}", [1, 2, 3], SamplingParams(max_tokens=50)) for i in range(5)]
    for req in reqs:
        s.add(req)
    s.update(s.schedule(), [5] * 5)  # every prompt, then a token each
    assert list(s.active) == ["r0", "r1", "r2", "r3", "r4"]
    s.finish(reqs[1], RequestStatus.FINISHED_ABORTED)
    s.preempt(reqs[3])
    assert list(s.active) == ["r0", "r2", "r4"]
    batch = s.schedule()  # the decode rows as they stand, then r3 admitted again
    assert batch.decodes_kept and list(batch.entries) == ["r0", "r2", "r4", "r3"]
    assert batch.num_decode == 3
    s.update(batch, [5] * sum(batch.sampling()))
    assert list(s.active) == ["r0", "r2", "r4", "r3"]  # r3 joins last
    s.update(s.schedule(), [5, 5, EOS, 5])  # r4 stops: out of the batch at once
    assert list(s.active) == ["r0", "r2", "r3"]


@pytest.fixture(scope="module")
def llama(tiny_model_dirs):
    return tiny_model_dirs["llama"]


def _chat(i: int) -> SamplingParams:
    """The chat mix's kinds of rows (benchmarks/bench_host_step.py): greedy, sampled,
    seeded, logprobs, a penalty, a grammar."""
    kinds = [
        {"temperature": 0.0},
        {"temperature": 0.7, "top_p": 0.9, "seed": 100 + i},
        {"temperature": 0.0, "logprobs": 3},
        {"temperature": 0.0, "presence_penalty": 0.5},
        {"temperature": 0.0, "structured": {"kind": "regex", "spec": "[a-z]{2,14}"}},
        {"temperature": 1.0, "seed": 7, "min_tokens": 3},
    ]
    return SamplingParams(max_tokens=6 + i % 7, **kinds[i % len(kinds)])


@pytest.mark.parametrize("overlap", ["on", "off"])
def test_an_engine_over_the_kept_batch_serves_as_one_taking_rows_afresh(
    llama, overlap, monkeypatch
):
    """Requests joining every other step over a KV pool small enough to preempt, with the
    chat mix's options: every request's tokens and logprobs are those of an engine whose
    scheduler takes its rows one by one every step."""
    from tests.scheduler_worker.test_engine import _prompts, make_engine

    prompts = _prompts(14, seed=3)

    def serve(kept: bool) -> tuple[list, int]:
        if not kept:
            monkeypatch.setattr(scheduler_module, "take_decodes", lambda *a: None)
        engine = make_engine(llama, num_blocks=20, async_scheduling=overlap)
        outs: dict[str, list] = {}
        for step in range(400):
            if step % 2 == 0 and step // 2 < len(prompts):
                i = step // 2
                engine.add_request(f"r{i}", prompts[i], _chat(i))
                outs[f"r{i}"] = []
            for out in engine.step():
                outs[out.request_id].append((out.new_token_ids, out.logprobs))
            assert all(map(inline_as_its_fields, engine.requests.values()))
            if step > 2 * len(prompts) and not engine.has_unfinished():
                break
        engine.block_manager.check_integrity()
        monkeypatch.undo()
        return [outs[f"r{i}"] for i in range(len(prompts))], engine.scheduler.num_preemptions

    kept, kept_preemptions = serve(True)
    fresh, fresh_preemptions = serve(False)
    assert kept == fresh
    assert kept_preemptions == fresh_preemptions > 0
    assert all(out for out in kept)


def test_the_count_of_live_rows_that_may_draft_follows_admission_preemption_and_finish():
    """Scheduler.num_speculating (take_decodes looks at no row while it is 0) is the number
    of live requests that may draft, whatever is admitted, preempted, aborted or finished;
    a row with a prediction keeps the kept batch out while it is active."""
    s = Scheduler(
        SchedulerConfig(max_num_seqs=6, max_num_batched_tokens=24),
        CacheConfig(block_size=4),
        num_blocks=12,
        eos_token_ids=[EOS],
    )
    rng, reqs, spec_steps, kept_with_spec = random.Random(5), [], 0, 0
    for step in range(200):
        if rng.random() < 0.4:
            rid = f"r{len(reqs)}"
            prompt = [rng.randrange(1, 29) for _ in range(rng.randrange(1, 9))]
            pred = [rng.randrange(1, 29) for _ in range(4)] if rng.random() < 0.3 else None
            params = SamplingParams(max_tokens=rng.randrange(1, 12), ignore_eos=True)
            reqs.append(Request(rid, prompt, params, prediction_token_ids=pred))
            s.add(reqs[-1])
        live = list(s.live.values())
        if live and rng.random() < 0.1:
            s.finish(rng.choice(live), RequestStatus.FINISHED_ABORTED)
        if live and rng.random() < 0.05:
            s.preempt(rng.choice(list(s.live.values())))
        drafting = any(r.speculates for r, _ in s.active.values())
        batch = s.schedule()
        assert s.num_speculating == sum(r.speculates for r in s.live.values()), step
        spec_steps += drafting
        kept_with_spec += drafting and batch.decodes_kept
        for req, index in s.advance(batch):
            s.resolve(req, index, _token(req.request_id, index))
    assert s.num_speculating == sum(r.speculates for r in s.live.values())
    assert sum(r.speculates for r in reqs) > 10 and spec_steps > 10
    assert kept_with_spec == 0
