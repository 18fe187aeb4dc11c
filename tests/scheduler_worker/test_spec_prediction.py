"""Predicted outputs (scheduler_worker/spec/prediction.py): the prediction drafter's
alignment and counts, and greedy outputs with a prediction equal to those without, token
for token, whatever --speculative-method is."""

from __future__ import annotations

import random

import pytest

from common.limits import RequestRejectedError
from common.sampling_params import SamplingParams
from scheduler_worker.spec.prediction import Prediction
from tests.scheduler_worker.test_engine import make_engine

PROMPT = [7, 7, 7]


def test_drafts_from_the_start_then_follow_the_output():
    pred = [10, 11, 12, 13, 14, 15, 16]
    p = Prediction(pred, len(PROMPT))
    assert p.propose(PROMPT, 3) == [10, 11, 12]  # no output yet: the prediction's start
    assert p.propose(PROMPT + [10, 11], 3) == [12, 13, 14]
    assert p.propose(PROMPT + [10, 11, 12, 13, 14, 15], 3) == [16]  # its end
    assert p.propose(PROMPT + [10, 11, 12, 13, 14, 15, 16], 3) == []
    assert (p.num_matched, p.num_rejected) == (7, 0)
    assert p.propose(PROMPT + [10, 11, 12, 13, 14, 15, 16, 17], 3) == []  # past it


def test_realigns_after_an_edit():
    # "def foo(x): return foo(x) + 1" with foo (20) renamed to bar (99): after the
    # renamed token the next one is found again just after the last match
    pred = [5, 20, 30, 40, 31, 8, 20, 30, 40, 31, 9, 1]
    p = Prediction(pred, len(PROMPT))
    out = PROMPT + [5, 99]
    assert p.propose(out, 4) == []  # 99 is nowhere in the prediction
    out.append(30)
    assert p.propose(out, 4) == [40, 31, 8, 20]  # 30 right after the last match (5)
    out += [40, 31, 8, 99, 30]
    assert p.propose(out, 3) == [40, 31, 9]  # the second 30, not the first
    p.advance(out + [40, 31, 9, 1])
    assert (p.num_matched, p.num_rejected) == (len(pred) - 2, 2)  # both foos rejected


def test_longer_matches_realign_anywhere_single_tokens_only_nearby():
    pred = list(range(100, 160))
    p = Prediction(pred, 0)
    # the output skips 30 tokens of the prediction: a 2-token match finds its place
    assert p.propose([100, 101, 1, 131], 2) == []  # one token, 30 past the last match
    assert p.propose([100, 101, 1, 131, 132], 2) == [133, 134]
    assert p.num_matched == 4  # 100, 101, 131, 132
    q = Prediction([1, 2, 3, 4, 1, 2, 3, 5], 0)
    # the model goes back to an earlier place: the first occurrence, for n >= 2
    assert q.propose([1, 2, 3, 4, 1, 2, 3, 5, 9, 2, 3], 2) == [4, 1]
    assert q.num_matched == 8  # positions are counted once


def test_alignment_does_not_depend_on_how_steps_cut_the_output():
    rng = random.Random(0)
    for trial in range(50):
        pred = [rng.randrange(8) for _ in range(rng.randrange(1, 60))]
        out = list(pred)
        for _ in range(rng.randrange(0, 6)):  # edits: replace, insert, delete
            i = rng.randrange(len(out) + 1)
            op = rng.randrange(3)
            if op == 0 and i < len(out):
                out[i] = rng.randrange(8, 12)
            elif op == 1:
                out[i:i] = [rng.randrange(12) for _ in range(rng.randrange(1, 4))]
            else:
                del out[i : i + rng.randrange(1, 4)]
        whole = Prediction(pred, 2)
        whole.advance([0, 0] + out)
        steps = Prediction(pred, 2)
        at = 0
        while at < len(out):
            at += rng.randrange(1, 6)
            steps.propose([0, 0] + out[:at], 3)
        assert (whole.num_matched, whole.cursor) == (steps.num_matched, steps.cursor), trial
        assert 0 <= whole.num_matched <= min(len(pred), len(out))
        assert whole.num_matched + whole.num_rejected == len(pred)
        if out == pred:
            assert whole.num_matched == len(pred)


def test_placeholder_stops_the_alignment():
    p = Prediction([1, 2, 3], 0)
    p.advance([1, -1])
    assert (p.upto, p.num_matched) == (1, 1)
    p.advance([1, 2])
    assert (p.upto, p.num_matched) == (2, 2)


@pytest.fixture(scope="module")
def llama(tiny_model_dirs):
    return tiny_model_dirs["llama"]


def _edited(tokens: list[int], seed: int) -> list[int]:
    rng = random.Random(seed)
    out = list(tokens)
    for _ in range(3):
        out[rng.randrange(len(out))] = rng.randrange(3, 500)
    return out


def _run(model_dir, prompts, params, predictions, **setup):
    engine = make_engine(model_dir, **setup)
    rids = [f"r{i}" for i in range(len(prompts))]
    for rid, prompt, pred in zip(rids, prompts, predictions):
        engine.add_request(rid, prompt, params, prediction=pred)
    outs: dict[str, list[int]] = {rid: [] for rid in rids}
    finished = {}
    while engine.has_unfinished():
        for o in engine.step():
            outs[o.request_id] += o.new_token_ids
            if o.finish_reason is not None:
                finished[o.request_id] = o.stage_times or {}
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
    return [outs[r] for r in rids], [finished[r] for r in rids], engine.counters


@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    "setup",
    [
        dict(speculative_method="none"),
        dict(speculative_method="ngram"),
        dict(num_blocks=20, max_num_seqs=8),
        # a GPU's default: overlapped, no method; a step whose rows draft resolves the
        # one in flight first (spec/overlap.py)
        dict(speculative_method="none", async_scheduling="on"),
    ],
    ids=["method-none", "method-ngram", "preemption", "overlapped"],
)
def test_greedy_equal_with_a_prediction(llama, setup):
    rng = random.Random(1)
    prompts = [[rng.randrange(3, 500) for _ in range(rng.randrange(4, 20))] for _ in range(6)]
    params = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    want, _, _ = _run(llama, prompts, params, [None] * len(prompts), **setup)
    # the exact output, an edited one, and one unrelated to it
    preds = [want[0], _edited(want[1], 1), _edited(want[2], 2), list(range(3, 60)), want[4], []]
    got, stages, counters = _run(llama, prompts, params, preds, **setup)
    assert got == want
    assert counters.accepted_tokens > 0  # drafts from the predictions pay...
    assert counters.draft_tokens > counters.accepted_tokens  # ...and some are refused
    accepted = [s["accepted_prediction_tokens"] for s in stages]
    rejected = [s["rejected_prediction_tokens"] for s in stages]
    assert accepted[0] == len(want[0]) and rejected[0] == 0
    assert 0 < accepted[1] < len(want[1]) and rejected[1] == len(preds[1]) - accepted[1]
    assert accepted[5] == rejected[5] == 0  # an empty prediction


def test_a_request_that_does_not_speculate_still_reports_its_counts(llama):
    prompt = [5, 6, 7, 8]
    params = SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True)
    (want,), _, _ = _run(llama, [prompt], params, [None])
    off = SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True, speculative=False)
    (got,), (stages,), counters = _run(llama, [prompt], off, [want])
    assert got == want and counters.draft_tokens == 0
    assert stages["accepted_prediction_tokens"] == len(want)


def test_prediction_beyond_the_context_refused(llama):
    engine = make_engine(llama)
    params = SamplingParams(max_tokens=4, temperature=0.0)
    with pytest.raises(RequestRejectedError, match="prediction is too long") as e:
        engine.add_request("r", [1, 2, 3], params, prediction=[5] * (engine.max_model_len + 1))
    assert e.value.param == "prediction"
    with pytest.raises(ValueError, match="outside the vocabulary"):
        engine.add_request("r", [1, 2, 3], params, prediction=[engine.vocab_size])
    assert not engine.has_unfinished()
