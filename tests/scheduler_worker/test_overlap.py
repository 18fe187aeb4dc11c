"""Overlapped scheduling (engine.step with async_scheduling on), run on the CPU as the GPU
runs it: step N+1 is scheduled and launched before step N's tokens are read, its decode
rows taking step N's tokens on the device. Whatever the overlap, every request must get
exactly the tokens the synchronous engine gives it, nothing after its finish, and the
block manager must end clean."""

from __future__ import annotations

import pytest

from common.sampling_params import SamplingParams
from scheduler_worker.request import PLACEHOLDER
from scheduler_worker.sampling import Sampler
from scheduler_worker.structured import GrammarMatchers
from tests.scheduler_worker.test_engine import _prompts, make_engine, run_staggered

GREEDY = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def llama(tiny_model_dirs):
    return tiny_model_dirs["llama"]


def both(model_dir, **kw):
    return make_engine(model_dir, async_scheduling="off", **kw), make_engine(
        model_dir, async_scheduling="on", **kw
    )


def test_overlap_is_on_only_where_asked_or_on_a_gpu(llama):
    sync, overlap = both(llama)
    assert not sync.overlap and overlap.overlap
    assert not make_engine(llama).overlap  # auto on a CPU: off


def test_auto_overlaps_whatever_the_speculative_method(llama, monkeypatch):
    """Where the device overlaps (a GPU's, stood in for), auto overlaps with a speculative
    method too: a step whose rows draft resolves the step in flight first
    (test_spec_overlap.py)."""
    from scheduler_worker.backends.cpu import CpuBackend

    monkeypatch.setattr(CpuBackend, "overlap", True)
    assert make_engine(llama, speculative_method="none").overlap
    assert make_engine(llama, speculative_method="ngram").overlap
    assert make_engine(llama).overlap  # auto: ngram on this device (a CPU)
    assert not make_engine(llama, speculative_method="ngram", async_scheduling="off").overlap


def test_overlapped_greedy_equals_synchronous(llama):
    prompts = _prompts(10, seed=5)
    sync, overlap = both(llama)
    want = run_staggered(sync, prompts, GREEDY)
    backend = overlap.runner.backend
    read_on_device = []
    resolve_prev = backend.resolve_prev
    backend.resolve_prev = lambda ids, prev: (  # type: ignore[method-assign]
        read_on_device.append(sum(r >= 0 for r in prev)),
        resolve_prev(ids, prev),
    )
    got = run_staggered(overlap, prompts, GREEDY)
    assert got == want
    assert all(len(o) == GREEDY.max_tokens for o in got)
    # most decode tokens came from the step in flight, not from the host
    assert sum(read_on_device) > len(prompts) * (GREEDY.max_tokens - 2) // 2
    assert overlap.num_running == 0 and not overlap.has_unfinished()


def test_overlap_with_preemption_and_chunked_prefill(llama):
    """Few blocks (preemption by recompute of a request whose token is in flight) and a
    small step budget (prompts in chunks)."""
    prompts = _prompts(8, seed=11)
    kw = {"num_blocks": 40, "max_num_batched_tokens": 16}
    sync, overlap = both(llama, **kw)
    want = run_staggered(sync, prompts, GREEDY, every=1)
    got = run_staggered(overlap, prompts, GREEDY, every=1)
    assert got == want
    assert overlap.scheduler.num_preemptions > 0


def test_a_stop_token_sends_nothing_after_it(llama):
    """The step after a stop token is already launched when the stop is read: its token
    for that request must never reach the client, nor stay in the request."""
    sync = make_engine(llama, async_scheduling="off")
    free = sync.generate([[5, 6, 7, 8]], SamplingParams(max_tokens=10, temperature=0.0))[0]
    stop = free[3]  # the 4th token becomes a stop token
    params = SamplingParams(max_tokens=10, temperature=0.0, stop_token_ids=[stop])
    for engine in both(llama):
        engine.add_request("r", [5, 6, 7, 8], params)
        outs = []
        while engine.has_unfinished():
            outs += [o for o in engine.step() if o.request_id == "r"]
        tokens = [t for o in outs for t in o.new_token_ids]
        assert tokens == free[: free.index(stop) + 1]
        assert [o.finish_reason for o in outs][-1] == "stop"
        assert sum(o.finish_reason is not None for o in outs) == 1
        engine.block_manager.check_integrity()
        assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


def test_abort_while_a_token_is_in_flight(llama):
    engine = make_engine(llama, async_scheduling="on")
    engine.add_request("a", [5, 6, 7], GREEDY)
    engine.add_request("b", [8, 9, 10], GREEDY)
    got: dict[str, list] = {"a": [], "b": []}
    for _ in range(4):
        for o in engine.step():
            got[o.request_id].append(o)
    assert engine._in_flight is not None  # a step's tokens are on their way
    assert engine.abort("a")
    while engine.has_unfinished():
        for o in engine.step():
            got[o.request_id].append(o)
    reasons_a = [o.finish_reason for o in got["a"] if o.finish_reason]
    assert reasons_a == ["abort"] and got["a"][-1].finish_reason == "abort"
    assert sum(len(o.new_token_ids) for o in got["b"]) == GREEDY.max_tokens
    engine.block_manager.check_integrity()


def _spy_pending(monkeypatch) -> list[list[int]]:
    """The pending_row of every row the sampler gets, a list a call."""
    calls: list[list[int]] = []
    real = Sampler.sample

    def sample(self, logits, rows, *args, **kw):
        calls.append([r.pending_row for r in rows])
        return real(self, logits, rows, *args, **kw)

    monkeypatch.setattr(Sampler, "sample", sample)
    return calls


def test_penalty_rows_stay_overlapped_and_equal_synchronous(llama, monkeypatch):
    """Penalties count the token in flight on the device (pending_row): the step does not
    wait for it, and the tokens equal the synchronous engine's, no placeholder left."""
    pens = [
        SamplingParams(max_tokens=10, temperature=0.0, repetition_penalty=1.3),
        SamplingParams(max_tokens=10, temperature=0.0, presence_penalty=1.5, ignore_eos=True),
        SamplingParams(max_tokens=10, temperature=0.0, frequency_penalty=2.0, ignore_eos=True),
    ]
    prompts = [[5, 6, 7], [9, 8, 7, 6], [3, 3, 3], [1, 2]]
    sync, overlap = both(llama)
    want = sync.generate(prompts, [*pens, GREEDY])
    calls = _spy_pending(monkeypatch)
    got = overlap.generate(prompts, [*pens, GREEDY])
    assert got == want
    assert all(PLACEHOLDER not in o for o in got)
    assert sum(r >= 0 for rows in calls for r in rows) >= 3 * 8  # read on the device


def _spy_ahead(monkeypatch) -> list[list[str]]:
    """The rows whose matcher took its token in flight before the resolve, a list a call."""
    calls: list[list[str]] = []
    real = GrammarMatchers.advance_ahead

    def advance_ahead(self, rows, token_ids):
        calls.append([r.request_id for r in rows])
        return real(self, rows, token_ids)

    monkeypatch.setattr(GrammarMatchers, "advance_ahead", advance_ahead)
    return calls


def test_a_grammar_row_stays_in_every_step(llama, monkeypatch):
    """A constrained row's next mask needs its token in flight: it stays in the batch, its
    forward launched with the others, and its mask is made once that token is read
    (GrammarMatchers.advance_ahead), before the sample launches. It takes as many steps as
    synchronously (no step sat out), and every row's tokens equal the synchronous engine's."""
    constrained = SamplingParams(
        max_tokens=8, temperature=0.0, structured={"kind": "regex", "spec": "[a-z]{2,12}"}
    )
    prompts = [[5, 6, 7], [9, 8, 7, 6], [1, 2]]
    sync, overlap = both(llama)
    want = sync.generate(prompts, [constrained, GREEDY, GREEDY])
    calls = _spy_ahead(monkeypatch)
    got = overlap.generate(prompts, [constrained, GREEDY, GREEDY])
    assert got == want
    # the constrained row alone, once a token after its first (a mask each)
    assert len(calls) >= len(want[0]) - 2 and all(len(rows) == 1 for rows in calls)
    # the same steps as synchronously, and one more: the last in flight, resolved after
    assert overlap.counters.num_steps <= sync.counters.num_steps + 1
    assert not overlap.grammars.ahead and not overlap.grammars.matchers
    overlap.block_manager.check_integrity()


def _staggered(engine, prompts, params) -> list[list[int]]:
    """run_staggered with each prompt's own params: one request added every other step."""
    outs: dict[str, list[int]] = {str(i): [] for i in range(len(prompts))}
    pending, step = list(enumerate(zip(prompts, params))), 0
    while pending or engine.has_unfinished():
        if pending and step % 2 == 0:
            i, (prompt, p) = pending.pop(0)
            engine.add_request(str(i), prompt, p)
        for out in engine.step():
            outs[out.request_id].extend(out.new_token_ids)
        step += 1
    return list(outs.values())


def test_grammar_rows_that_end_stop_or_sample_equal_synchronous(llama):
    """Grammar rows overlapped among plain, seeded and penalized ones: grammars that
    complete (the row stops there, its next forward already launched), rows that stop
    on EOS, sampled and seeded constrained rows, staggered arrivals. Each row's tokens
    equal the synchronous engine's; nothing is left behind."""
    short = {"kind": "regex", "spec": "[a-z]{2,4}"}
    long = {"kind": "regex", "spec": "[a-z ]{4,40}"}
    params = [
        SamplingParams(max_tokens=12, temperature=0.0, structured=short),
        SamplingParams(max_tokens=12, temperature=0.9, seed=3, structured=long),
        SamplingParams(max_tokens=10, temperature=0.0, presence_penalty=1.0, ignore_eos=True),
        SamplingParams(max_tokens=12, temperature=1.0, top_p=0.9, seed=11, structured=short),
        GREEDY,
        SamplingParams(max_tokens=9, temperature=0.0, structured=long),
        SamplingParams(max_tokens=12, temperature=0.8, seed=5),
    ]
    prompts = _prompts(len(params), seed=9)
    sync, overlap = both(llama)
    want, got = _staggered(sync, prompts, params), _staggered(overlap, prompts, params)
    assert got == want
    assert any(len(w) < 12 for w in want[:2])  # some grammar completed before max_tokens
    assert all(PLACEHOLDER not in o for o in got)
    assert not overlap.grammars.ahead and not overlap.grammars.matchers
    overlap.block_manager.check_integrity()


def test_seeded_sampling_is_the_same_overlapped(llama):
    seeded = SamplingParams(max_tokens=10, temperature=1.0, top_p=0.9, seed=7, ignore_eos=True)
    sync, overlap = both(llama)
    prompts = [[5, 6, 7], [1, 2], [3, 4, 5, 6]]
    assert overlap.generate(prompts, seeded) == sync.generate(prompts, seeded)


def test_out_of_device_memory_fails_that_step_and_the_engine_serves_on(llama):
    """A step that runs out of device memory fails its own requests (the worker answers
    each with a 503), gives their blocks back, and the next steps are served."""
    import torch

    engine = make_engine(llama, async_scheduling="on")
    engine.add_request("a", [5, 6, 7], GREEDY)
    engine.add_request("b", [8, 9], GREEDY)
    real = engine.runner.execute

    def out_of_memory(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory (a test)")

    engine.runner.execute = out_of_memory  # type: ignore[method-assign]
    engine.step()
    oom = ("out of device memory in this request's step", 503)
    assert sorted(engine.take_failed()) == [("a", *oom), ("b", *oom)]
    assert engine.take_failed() == []
    assert not engine.has_unfinished()
    bm = engine.block_manager
    bm.check_integrity()
    assert bm.num_free_blocks == bm.num_blocks
    engine.runner.execute = real  # type: ignore[method-assign]
    assert [len(o) for o in engine.generate([[1, 2, 3]], GREEDY)] == [GREEDY.max_tokens]


def test_prompt_logprobs_arriving_while_rows_finish(llama):
    """A step computing prompt logprobs resolves the step in flight first; a row that
    finishes on that token (a stop token) leaves the scheduled batch with its count
    (ScheduledBatch.drop), so the prompt chunk beside it is not taken for a row that
    samples. Every row's tokens equal the synchronous engine's."""
    a, b, long_prompt = [5, 6, 7], [9, 8, 7, 6], list(range(3, 63))
    free = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    sync, overlap = both(llama, max_num_batched_tokens=16)
    first = sync.generate([a], free)[0]
    stop = first[2]
    assert stop not in first[:2]
    stops = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True, stop_token_ids=[stop])
    plp = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True, prompt_logprobs=1)

    def run(engine):
        outs: dict[str, list[int]] = {"a": [], "b": [], "p": []}
        engine.add_request("a", a, stops)
        engine.add_request("b", b, free)
        for step in range(100):
            if step == 1:  # its 60 tokens take steps of 16 while "a" stops
                engine.add_request("p", long_prompt, plp)
            for out in engine.step():
                outs[out.request_id].extend(out.new_token_ids)
            if not engine.has_unfinished():
                break
        engine.block_manager.check_integrity()
        return outs

    want = run(sync)
    assert want["a"] == first[:3] and len(want["p"]) == 3
    assert run(overlap) == want


@pytest.mark.parametrize("overlap", ["off", "on"])
def test_every_output_counts_the_tokens_out_so_far(llama, overlap):
    """num_output_tokens (the usage's completion_tokens; a stop string's finish takes the
    last one the detokenizer saw) is the tokens a request has sent, on every output and
    whichever way it ends: a grammar completed, an abort with a token in flight, a stop
    id, max_tokens. Overlapped, a row's placeholder for the step in flight counted too:
    one more on every output but a plain last one (usage over by one on a GPU)."""
    from tests.scheduler_worker.test_structured import SPECS

    engine = make_engine(llama, async_scheduling=overlap, speculative_method="none")
    prompt = [5, 39, 39, 7, 29, 39, 8]
    plain = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    (ref,) = engine.generate([prompt], plain)  # a stop id it meets at its 4th token
    params = {
        "grammar": SamplingParams(max_tokens=30, temperature=0, structured=SPECS[1]),
        "abort": SamplingParams(max_tokens=24, temperature=0, ignore_eos=True),
        "stop_id": SamplingParams(max_tokens=24, temperature=0, stop_token_ids=[ref[3]]),
        "length": SamplingParams(max_tokens=9, temperature=0, ignore_eos=True),
    }
    for rid, p in params.items():
        engine.add_request(rid, prompt, p)
    sent: dict[str, int] = dict.fromkeys(params, 0)
    finish: dict[str, str] = {}
    step = 0
    while engine.has_unfinished():
        if step == 5:
            assert engine.abort("abort")
        for o in engine.step():
            assert o.request_id not in finish, "an output after the finish"
            sent[o.request_id] += len(o.new_token_ids)
            assert o.num_output_tokens == sent[o.request_id], (o, sent)
            if o.finish_reason:
                finish[o.request_id] = o.finish_reason
        step += 1
    assert finish == {"grammar": "stop", "abort": "abort", "stop_id": "stop", "length": "length"}
    assert sent["length"] == 9 and sent["abort"] > 0
    engine.block_manager.check_integrity()
