"""scheduler_worker.resolve_rows: the common row resolved inline, as Scheduler.resolve and
the engine's output would; every other row handed to `other`, in its place."""

from __future__ import annotations

from collections import deque

import pytest

from common.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from common.sampling_params import SamplingParams
from scheduler_worker.engine import LLMEngine
from scheduler_worker.request import Request, RequestStatus
from scheduler_worker.resolve_rows import resolve_rows
from scheduler_worker.sampling import TokenLogprobs
from scheduler_worker.scheduler import Scheduler
from scheduler_worker.step_output import OutputColumns, RequestOutput

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
    for r in (plain, stops, penalized):  # not their first token (as resolve() would set)
        r.first_token_time, r.resolves_inline = 1.0, True
    seen: list[str] = []

    def other(req, index, token, lp):
        seen.append(req.request_id)
        sched.resolve(req, index, token)
        return None

    lp = TokenLogprobs(6, -0.5, [6], [-0.5])
    outputs = OutputColumns()
    resolve_rows(sched, sampled, [5, EOS, 6, 7], [None, None, lp, None], {}, other, outputs)
    assert seen == ["stops", "first"]  # a stop token, a first token
    # the output a RequestOutput built field by field would be (the inline one's fields go
    # into the columns alone); a penalty changes nothing here, a token's logprobs go in it
    assert outputs.outputs() == [
        RequestOutput("plain", [5], None, None, 20, 1, 0),
        RequestOutput("pen", [6], None, [lp], 20, 1, 0),
    ]
    assert outputs.token_ids == [5, 6] and not outputs.counts and not outputs.apart
    assert plain.output_token_ids == [5] and plain.num_pending == 0
    assert plain.token_ids[-1] == 5 and plain.status is RequestStatus.RUNNING
    assert stops.status is RequestStatus.FINISHED_STOPPED
    assert first.output_token_ids == [7] and first.first_token_time is not None
    assert first.resolves_inline and plain.resolves_inline and not stops.resolves_inline
    # the blocks the known tokens fill are hashed, as resolve() would
    assert plain.num_hashed_blocks == 20 // 4 and sched.blocks.check_integrity() is None


def test_the_last_token_and_a_drafted_row_go_to_other():
    sched = _scheduler()
    last = _running(sched, "last")
    drafted = _running(sched, "drafted")
    sampled = sched.advance(sched.schedule())
    last.max_tokens = 1  # this token is its last
    last.first_token_time = drafted.first_token_time = 1.0
    last.resolves_inline = drafted.resolves_inline = True
    seen: list[str] = []

    def other(req, index, token, lp):
        seen.append(req.request_id)
        sched.resolve(req, index, token)
        return None

    drafts = {"drafted": ([1], [1])}
    resolve_rows(sched, sampled, [5, 6], [None, None], drafts, other, OutputColumns())
    assert seen == ["last", "drafted"] and last.status is RequestStatus.FINISHED_LENGTH


@pytest.fixture(scope="module")
def llama(tiny_model_dirs):
    return tiny_model_dirs["llama"]


def test_fused_steps_give_what_advance_then_resolve_gives(llama, monkeypatch):
    """Overlapped steps whose rows advance in the resolve loop (resolve_and_advance) give
    the outputs, row for row, step for step, of advance then resolve_rows, with rows that
    join, stop on a token, end at max_tokens and are aborted, and the same cache."""
    import scheduler_worker.engine as engine_module
    from tests.scheduler_worker.test_engine import _prompts, make_engine

    prompts = _prompts(6, seed=7)

    def serve(fuse: bool, stops: dict[int, int]) -> tuple[list, int, list]:
        real, fused = engine_module.fusable, [0]

        def fusable(*args):
            ok = real(*args) if fuse else None
            fused[0] += ok is not None
            return ok

        monkeypatch.setattr(engine_module, "fusable", fusable)
        # plain decode steps (the fused loop's case): a step with drafts is never fused
        engine = make_engine(llama, async_scheduling="on", speculative_method="none")
        steps = []
        for step in range(34):
            if step < len(prompts):  # one joins each step, then the batch stays
                params = SamplingParams(
                    max_tokens=6 + 4 * step, temperature=0.0, stop_token_ids=[stops.get(step, 1)]
                )
                engine.add_request(f"r{step}", prompts[step], params)
            if step == 9:
                engine.abort("r4")
            outputs = [o._replace(stage_times=None) for o in engine.step()]  # times differ
            steps.append((outputs, dict(engine.block_manager.hash_to_block)))  # blocks filled
        engine.block_manager.check_integrity()
        assert not engine.has_unfinished()
        monkeypatch.undo()
        blocks = engine.block_manager  # the prefix cache as the blocks filled
        return steps, fused[0], [blocks.hash_to_block, list(blocks.free_blocks)]

    first, _, _ = serve(False, {})
    # a token each of r1 and r5 sampled mid-way stops them there in the runs compared
    stops = {
        i: [o for s, _ in first for o in s if o.request_id == f"r{i}"][4].new_token_ids[0]
        for i in (1, 5)
    }
    want, none_fused, want_cache = serve(False, stops)
    got, fused, cache = serve(True, stops)
    assert none_fused == 0 and fused >= 8
    assert got == want and cache == want_cache
    reasons = {o.request_id: o.finish_reason for s, _ in got for o in s if o.finish_reason}
    assert reasons["r1"] == reasons["r5"] == "stop" and reasons["r4"] == "abort"
    assert reasons["r0"] == "length"


def test_penalty_and_logprobs_rows_inline_give_the_engines_outputs(llama):
    """Rows with a penalty or logprobs, resolved inline (fused and not), give the outputs,
    tokens, logprobs and prefix cache of the same rows all sent to the engine's own path
    (resolves_apart), step for step; a grammar row still goes there."""
    from tests.scheduler_worker.test_engine import _prompts, make_engine

    prompts = _prompts(8, seed=3)
    kinds = [
        {"presence_penalty": 0.5},
        {"logprobs": 3},
        {"frequency_penalty": 0.3, "logprobs": 2, "seed": 5},
        {},
        {"repetition_penalty": 1.2, "top_p": 0.9, "seed": 9},
        {"logprobs": 1, "max_tokens": 5},
        {"structured": {"kind": "regex", "spec": "[ab]+"}, "max_tokens": 9},
        {"logprobs": 2, "presence_penalty": 1.0, "max_tokens": 7},
    ]

    def serve(apart: bool) -> tuple[list, dict]:
        engine = make_engine(llama, async_scheduling="on", speculative_method="none")
        steps = []
        for step in range(30):
            if step < len(prompts):
                kw = {"max_tokens": 12, "temperature": 0.8, "seed": 100 + step, **kinds[step]}
                engine.add_request(f"r{step}", prompts[step], SamplingParams(**kw))
                if apart:
                    engine.requests[f"r{step}"].resolves_apart = True
            steps.append([o._replace(stage_times=None) for o in engine.step()])
        assert not engine.has_unfinished()
        return steps, dict(engine.block_manager.hash_to_block)

    want, got = serve(True), serve(False)
    assert got == want
    lps = [o.logprobs for s in got[0] for o in s if o.request_id == "r1"]
    assert len(lps) == 12 and all(lp is not None and len(lp[0].top_ids) == 3 for lp in lps)


@pytest.mark.parametrize("num_blocks", [512, 40])
def test_fused_with_grammar_rows_and_rows_ending_gives_the_unfused_outputs(
    llama, monkeypatch, num_blocks
):
    """Grammar rows (in every overlapped step, their masks made after the forward) beside
    rows that end: the launched rows are then a subsequence of the step in flight's. Fused
    (_resolve_and_advance_some) and not, the outputs, logprobs and prefix cache are the
    same, step for step, with rows that stop, end, are aborted, are preempted (40 blocks)
    and sample with seeds and penalties."""
    import scheduler_worker.engine as engine_module
    from tests.scheduler_worker.test_engine import _prompts, make_engine

    prompts = _prompts(10, seed=11)
    kinds = [
        {"temperature": 0.0},
        {"structured": {"kind": "regex", "spec": "[a-z]{3,20}"}, "temperature": 0.0},
        {"temperature": 0.7, "top_p": 0.9, "seed": 4},
        {"temperature": 0.0, "logprobs": 2, "presence_penalty": 0.5},
        {"structured": {"kind": "regex", "spec": "[0-9]{2,9}"}, "temperature": 0.8, "seed": 8},
        {"temperature": 0.0, "max_tokens": 5},
        {"temperature": 0.9, "seed": 12, "logprobs": 1},
        {"structured": {"kind": "regex", "spec": "(ab|cd)+"}, "max_tokens": 7, "seed": 3},
        {"temperature": 0.0},
        {"temperature": 0.0, "frequency_penalty": 0.4},
    ]

    def serve(fuse: bool) -> tuple[list, int, dict, int]:
        real, subset, preempted = engine_module.fusable, [0], [0]

        def fusable(sched, batch, sampled):
            ok = real(sched, batch, sampled) if fuse else None
            subset[0] += ok is not None and (bool(ok.joins) or len(ok.rows) != len(sampled))
            return ok

        monkeypatch.setattr(engine_module, "fusable", fusable)
        engine = make_engine(llama, num_blocks, async_scheduling="on", speculative_method="none")
        steps = []
        for step in range(60):
            if step < len(prompts):
                kw = {"max_tokens": 16, **kinds[step]}
                engine.add_request(f"r{step}", prompts[step], SamplingParams(**kw))
            if step == 14:
                engine.abort("r8")
            outputs = engine.step()
            preempted[0] += sum(o.stage_times["num_preemptions"] for o in outputs if o.stage_times)
            steps.append([o._replace(stage_times=None) for o in outputs])
        engine.block_manager.check_integrity()
        assert not engine.has_unfinished()
        monkeypatch.undo()
        return steps, subset[0], dict(engine.block_manager.hash_to_block), preempted[0]

    want, none, want_cache, _ = serve(False)
    got, subset, cache, preempted = serve(True)
    assert none == 0 and subset >= 5 and (preempted > 0) == (num_blocks == 40)
    assert got == want and cache == want_cache
    reasons = {o.request_id: o.finish_reason for s in got for o in s if o.finish_reason}
    assert reasons["r8"] == "abort" and reasons["r5"] == "length" and len(reasons) == 10


@pytest.mark.parametrize("overlap", ["on", "off"])
def test_step_gives_request_outputs_and_step_rows_the_same_fields(tiny_llama_dir, overlap):
    """The worker's loop reads step_rows (columns, a common row's fields in them alone);
    step() names every row: the same fields, row for row, step for step, with logprobs and
    the rows that finish and are aborted."""

    def run(method: str) -> list[list[RequestOutput]]:
        engine = LLMEngine(
            EngineConfig(
                model=ModelConfig(model=str(tiny_llama_dir), dtype="float32"),
                cache=CacheConfig(block_size=4, num_blocks=64),
                scheduler=SchedulerConfig(async_scheduling=overlap, speculative_method="none"),
            ),
            tiny_llama_dir,
        )
        for i in range(4):
            params = SamplingParams(
                max_tokens=6, temperature=0.0, ignore_eos=True, logprobs=2 if i == 1 else None
            )
            engine.add_request(f"r{i}", [5 + i, 9, 11, 13], params)
        steps: list[list[RequestOutput]] = []
        while engine.has_unfinished():
            if len(steps) == 3:
                engine.abort("r3")
            got = getattr(engine, method)()
            steps.append(got.outputs() if method == "step_rows" else got)
        return steps

    named, columns = run("step"), run("step_rows")
    assert all(type(o) is RequestOutput for s in named for o in s)
    # every field but the finishing rows' stage times (each run's own clock)
    assert [[o._replace(stage_times=None) for o in s] for s in columns] == [
        [o._replace(stage_times=None) for o in s] for s in named
    ]
    reasons = [o.finish_reason for s in named for o in s if o.finish_reason]
    assert sorted(reasons) == ["abort", "length", "length", "length"]
    lps = [o.logprobs for s in named for o in s if o.request_id == "r1" and o.new_token_ids]
    assert len(lps) == 6 and all(len(lp) == 1 and len(lp[0].top_ids) == 2 for lp in lps)


def test_output_columns_give_back_the_outputs_added():
    """OutputColumns.add keeps a row's fields in the columns, a finishing row or one with
    prompt logprobs whole as well; outputs() gives every row back as it came, with common
    rows' fields appended between (the resolve loop's) in their place."""
    lp = TokenLogprobs(6, -0.5, [6, 2], [-0.5, -1.5])
    rows = [
        RequestOutput("a", [], "abort", None, 4, 0, 0, None, {"received": 1.0}),
        RequestOutput("b", [3, 4, 5], None, [lp, lp, lp], 7, 9, 4),
        RequestOutput("c", [8], "stop", None, 2, 3, 0, 8, {"received": 2.0}),
        RequestOutput("d", [1], None, None, 5, 1, 0, None, None, [None, [5, -1.0, []]]),
    ]
    columns = OutputColumns.of(rows[:2])
    for name, ids in (("x", [11]), ("y", [12])):  # common rows: their fields in the columns
        columns.request_ids.append(name)
        columns.token_ids += ids
        columns.num_prompt.append(20)
        columns.num_output.append(3)
        columns.num_cached.append(16)
    deque(map(columns.add, rows[2:]), 0)
    common = [RequestOutput(n, t, None, None, 20, 3, 16) for n, t in (("x", [11]), ("y", [12]))]
    assert columns.outputs() == [*rows[:2], *common, *rows[2:]]
    assert len(columns) == 6 and columns.token_ids == [3, 4, 5, 11, 12, 8, 1]
    assert columns.counts == {0: 0, 1: 3} and sorted(columns.apart) == [0, 4, 5]
