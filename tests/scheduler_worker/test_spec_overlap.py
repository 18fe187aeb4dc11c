"""Drafting beside overlapped scheduling (scheduler_worker/spec/overlap.py): a step whose
rows may draft resolves the step in flight first, a try that finds no draft backs off so
that the steps stay overlapped, and the outputs are the synchronous engine's (a prediction
beside the overlap: test_spec_prediction.py; the draft model: test_spec_draft_model.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from common.sampling_params import SamplingParams
from scheduler_worker.engine_status import spec_figures
from scheduler_worker.scheduled_batch import ScheduledBatch
from scheduler_worker.spec.overlap import MAX_WAIT, DraftGate
from tests.scheduler_worker.test_engine import _prompts, make_engine, run_staggered
from tests.scheduler_worker.test_spec_ngram import _repetitive

GREEDY = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)


class _Sched(SimpleNamespace):
    """The scheduler as the gate reads it: how many rows may draft, the policy's call."""

    def drafting(self, overlapped: bool = False) -> bool:
        assert overlapped  # the policy asked even where only predictions draft
        self.asked += 1
        return self.answer


def _batch(drafts: bool) -> ScheduledBatch:
    batch = ScheduledBatch()
    if drafts:
        batch.drafts["r"] = [1, 2]
    return batch


def test_a_try_without_drafts_doubles_the_plain_steps_before_the_next():
    gate, sched = DraftGate(), _Sched(num_speculating=1, answer=True, asked=0)
    plain: list[int] = []  # plain steps before each try after the first
    n = -1
    for _ in range(400):  # every try finds nothing
        drafting = gate.decide(sched)
        if drafting:
            if n >= 0:
                plain.append(n)
            n = 0
        else:
            n += 1
        gate.settle(drafting, _batch(False))
    assert plain[:7] == [1, 3, 7, 15, 31, 63, MAX_WAIT] and max(plain) == MAX_WAIT
    assert sched.asked == gate.tries == len(plain) + 1  # the policy asked at tries only
    gate, sched.asked = DraftGate(), 0
    gate.settle(gate.decide(sched), _batch(False))
    assert gate.decide(sched) is False and sched.asked == 1  # waiting: the policy not asked
    assert gate.decide(sched) is True
    gate.settle(True, _batch(True))  # drafts found: every step tries again
    assert (gate.misses, gate.wait) == (0, 0)
    assert gate.decide(sched) is True and gate.tries == 3


def test_no_row_that_may_draft_or_a_policy_saying_no_leaves_the_overlap_alone():
    gate = DraftGate()
    assert gate.decide(_Sched(num_speculating=0, answer=True, asked=0)) is None
    no = _Sched(num_speculating=2, answer=False, asked=0)
    for _ in range(3):
        drafting = gate.decide(no)
        gate.settle(drafting, _batch(False))
        assert drafting is False
    assert (no.asked, gate.misses, gate.wait, gate.tries) == (3, 0, 0, 0)


@pytest.fixture(scope="module")
def llama(tiny_model_dirs):
    return tiny_model_dirs["llama"]


def _engine(model_dir, **kw):
    return make_engine(model_dir, num_speculative_tokens=4, speculative_policy="always", **kw)


@pytest.mark.timeout(600)
def test_ngram_drafts_beside_the_overlap_and_outputs_stay_exact(llama):
    prompts = _repetitive(6, seed=4)
    want = run_staggered(_engine(llama, speculative_method="none"), prompts, GREEDY)
    engine = _engine(llama, speculative_method="ngram", async_scheduling="on")
    assert engine.overlap
    assert run_staggered(engine, prompts, GREEDY) == want
    assert engine.counters.accepted_tokens > 0 and engine.gate.tries > 0
    # the replica's beat carries the steps that gave up the overlap (/metrics: resolved_first)
    assert spec_figures(engine)["spec"]["resolved_first_steps"] == engine.gate.tries
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


class _Nothing:
    """A drafter that never finds a draft (a chat: nothing repeats)."""

    def propose(self, token_ids, state, k):
        return [], state

    def observe(self, prompt_token_ids, output_token_ids):
        pass


def test_rows_that_find_no_draft_stay_overlapped(llama):
    """Tries back off: of a 40-token output's steps, a few resolve the step in flight
    first; the others read their rows' last tokens on the device."""
    prompts = _prompts(1, seed=7)
    want = run_staggered(_engine(llama, speculative_method="none"), prompts, GREEDY)
    engine = _engine(llama, speculative_method="ngram", async_scheduling="on")
    engine.scheduler.drafter = _Nothing()
    backend = engine.runner.backend
    read_on_device = []
    resolve_prev = backend.resolve_prev
    backend.resolve_prev = lambda ids, prev: (
        read_on_device.append(sum(r >= 0 for r in prev)),
        resolve_prev(ids, prev),
    )
    assert run_staggered(engine, prompts, GREEDY) == want
    assert 1 <= engine.gate.tries <= 6  # steps 1, 3, 7, 15, 31 of 40 (and the prefill's)
    assert sum(read_on_device) >= GREEDY.max_tokens - 8
    assert engine.counters.draft_tokens == 0


def test_a_prediction_beside_the_overlap_asks_the_policy(llama):
    """Synchronously a request's prediction drafts without asking the policy; beside the
    overlap a draft costs every row the overlap of its step, so the policy's fit decides
    (the default, adaptive), as for a method's drafts."""
    prompt = _prompts(1, seed=3)[0]
    fits = {}
    for mode in ("off", "on"):
        engine = make_engine(llama, speculative_method="none", async_scheduling=mode)
        engine.add_request("p", prompt, GREEDY, prediction=list(range(3, 43)))
        while engine.has_unfinished():
            engine.step()
        fits[mode] = sum(f.steps for f in engine.scheduler.policy.fits.values())
    assert fits["off"] == 0 and fits["on"] > 0
