"""scheduler_worker.batch_params: a step's sampling parameters kept between steps, and the
sampler reading them: the same tokens as with each row's parameters read afresh."""

from __future__ import annotations

import random
from dataclasses import replace

import numpy as np
import torch

from common.sampling_params import SamplingParams
from scheduler_worker.batch_params import NUM_VALUES, BatchParams, BatchParamsCache, values_of
from scheduler_worker.sampling import Sampler, SamplingRow

EOS = 2


# one row of each kind: greedy, a draw, a bias, a penalty with logprobs, min_tokens
ONE_OF_EACH_KIND = [
    SamplingParams(temperature=0.0),
    SamplingParams(temperature=0.7, top_p=0.9, seed=3),
    SamplingParams(temperature=0.0, logit_bias={5: 1.0}),
    SamplingParams(temperature=0.0, presence_penalty=0.5, logprobs=2),
    SamplingParams(temperature=0.0, min_tokens=4),
]


def test_the_rows_of_each_kind():
    params = ONE_OF_EACH_KIND
    b = BatchParams.of(params)
    assert not b.plain
    assert (b.draws, b.biased, b.penalized, b.logprobs, b.min_tokens) == ([1], [2], [3], [3], [4])
    assert BatchParams.of([params[0], params[4]]).plain  # min_tokens: checked a step at a time


def test_kept_while_the_rows_are_the_same_and_rebuilt_when_they_change():
    greedy, hot = SamplingParams(temperature=0.0), SamplingParams(temperature=1.0)
    cache = BatchParamsCache()
    first = cache.get([greedy, hot])
    assert cache.get([greedy, hot]) is first  # a new list of the same rows
    assert cache.get([hot, greedy]).draws == [0]  # reordered: rebuilt
    assert cache.get([greedy]).draws == [] and cache.get([greedy]).plain


def test_a_sampler_over_changing_batches_samples_as_a_fresh_one():
    """Steps whose rows change (a bias row joins, a greedy row leaves, min_tokens runs
    out) give the tokens a new Sampler gives for each step alone."""
    logits = torch.randn(3, 64, generator=torch.Generator().manual_seed(1))
    greedy = SamplingParams(temperature=0.0)
    biased = SamplingParams(temperature=0.0, logit_bias={7: 100.0})
    waits = SamplingParams(temperature=0.0, min_tokens=2)
    logits[:, EOS] = 50.0  # EOS is every row's argmax
    steps = [
        [SamplingRow(greedy, [], []), SamplingRow(greedy, [], [])],
        [SamplingRow(greedy, [], []), SamplingRow(biased, [], [])],
        [SamplingRow(biased, [], []), SamplingRow(waits, [], [1])],  # 1 output: masked
        [SamplingRow(biased, [], []), SamplingRow(waits, [], [1, 1])],  # 2: EOS allowed
        [SamplingRow(greedy, [], []), SamplingRow(biased, [], []), SamplingRow(greedy, [], [])],
    ]
    kept = Sampler(64, [EOS])
    want = [[EOS, EOS], [EOS, 7], [7, None], [7, EOS], [EOS, 7, EOS]]
    for rows, expect in zip(steps, want):
        got = kept(logits[: len(rows)], rows).token_ids
        assert got == Sampler(64, [EOS])(logits[: len(rows)], rows).token_ids
        assert [e is None and g != EOS or g == e for g, e in zip(got, expect)] == [True] * len(rows)


def _kinds(b: BatchParams) -> tuple:
    return (b.plain, b.min_tokens, b.draws, b.penalized, b.biased, b.logprobs)


def test_the_slots_kinds_equal_the_rows_own_as_rows_join_leave_and_slots_are_reused():
    """Random steps over 6 slots: rows skip steps (not scheduled in one), leave, and
    a new request takes a freed slot with other parameters; the kinds read from the slots
    are always those of the rows' own parameters."""
    kinds = [*ONE_OF_EACH_KIND, SamplingParams(temperature=1.0, logprobs=0)]
    rng = random.Random(5)
    held = {s: rng.choice(kinds) for s in range(6)}  # slot -> its request's parameters
    cache = BatchParamsCache()
    for _ in range(300):
        if rng.random() < 0.2:  # a request ends; a new one (a fresh object) takes the slot
            slot = rng.randrange(6)
            held[slot] = replace(rng.choice(kinds))
        slots = [s for s in range(6) if rng.random() < 0.8]
        rng.shuffle(slots) if rng.random() < 0.3 else None
        params = [held[s] for s in slots]
        assert _kinds(cache.get(params, slots)) == _kinds(BatchParams.of(params))


def test_a_batch_whose_rows_come_and_go_is_not_rebuilt_from_its_rows(monkeypatch):
    """Rows that leave a batch and come back: with slots, the kinds come from the slots
    (no pass over the rows' parameters) after the first two steps."""
    greedy, hot = SamplingParams(temperature=0.0), SamplingParams(temperature=0.7)
    cache = BatchParamsCache()
    cache.get([greedy, hot, hot], [0, 1, 2])
    cache.get([greedy, hot], [0, 2])
    built = []
    monkeypatch.setattr(BatchParams, "of", classmethod(lambda cls, p: built.append(p)))
    for _ in range(3):
        assert cache.get([greedy, hot, hot], [0, 1, 2]).draws == [1, 2]
        assert cache.get([greedy, hot], [0, 2]).draws == [1]
    assert built == []


def test_a_sampler_with_slots_samples_as_one_without():
    """Seeded and greedy rows with penalties, bias, min_tokens and logprobs: the same
    tokens and logprobs whether the rows carry their slots (kinds kept per slot) or not."""
    logits = torch.randn(4, 300, generator=torch.Generator().manual_seed(2))
    params = [
        SamplingParams(temperature=0.8, top_p=0.9, seed=11, logprobs=3),
        SamplingParams(temperature=0.0, presence_penalty=0.5),
        SamplingParams(temperature=0.5, seed=7, logit_bias={9: 3.0}),
        SamplingParams(temperature=0.0, min_tokens=3, logprobs=1),
    ]
    with_slots, without = Sampler(300, [EOS]), Sampler(300, [EOS])
    for step, order in enumerate([[0, 1, 2, 3], [0, 2], [3, 1, 0], [0, 1, 2, 3]]):
        rows = [SamplingRow(params[i], [5, 6], [9] * step, slot=i) for i in order]
        plain = [replace(r, slot=-1) for r in rows]
        a, b = with_slots(logits[: len(rows)], rows), without(logits[: len(rows)], plain)
        assert a.token_ids == b.token_ids
        assert a.logprobs == b.logprobs


def test_the_slots_numbers_equal_the_rows_own_as_rows_join_leave_and_slots_are_reused():
    """The per-slot numbers (temperature, top_p, min_p, top_k, logprobs, seed) gathered
    for a step are always those of the rows' own parameters, over random joins, leaves,
    sit-outs and slot reuse (a new request never reads its slot's last holder's)."""
    kinds = [
        *ONE_OF_EACH_KIND,
        SamplingParams(temperature=1.3, top_k=7, min_p=0.2, seed=-5),
        SamplingParams(temperature=0.9, top_p=0.5, seed=2**64 - 1, logprobs=20),
    ]
    rng = random.Random(6)
    held = {s: rng.choice(kinds) for s in range(6)}
    cache = BatchParamsCache()
    for _ in range(300):
        if rng.random() < 0.2:
            held[rng.randrange(6)] = replace(rng.choice(kinds))
        slots = [s for s in range(6) if rng.random() < 0.8]
        rng.shuffle(slots) if rng.random() < 0.3 else None
        params = [held[s] for s in slots]
        got = cache.get(params, slots).values
        assert got.shape == (len(params), NUM_VALUES)
        assert np.array_equal(got, values_of(params))


def test_a_request_in_a_freed_slot_samples_with_its_own_parameters():
    """Slot 0 held a seeded top-k row with min_p and logprobs; the request that takes it
    next (other seed, top_p, temperature, no logprobs) samples what a fresh sampler gives
    it, step after step, and so does the row beside it."""
    logits = torch.randn(2, 500, generator=torch.Generator().manual_seed(3))
    old = SamplingParams(temperature=1.5, top_k=3, min_p=0.3, seed=1, logprobs=4)
    new = SamplingParams(temperature=0.6, top_p=0.8, seed=2**40 + 9)
    beside = SamplingParams(temperature=1.0, seed=12, presence_penalty=0.5)
    kept = Sampler(500, [EOS])
    for step in range(3):
        rows = [SamplingRow(old, [1], [4] * step, slot=0), SamplingRow(beside, [1], [], slot=1)]
        kept(logits, rows)
    for step in range(4):
        rows = [SamplingRow(new, [1], [4] * step, slot=0), SamplingRow(beside, [1], [], slot=1)]
        got = kept(logits, rows)
        fresh = Sampler(500, [EOS])(logits, [replace(r, slot=-1) for r in rows])
        assert got.token_ids == fresh.token_ids
        assert got.logprobs == [None, None]  # the old holder's logprobs did not stay
