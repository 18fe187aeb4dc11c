"""scheduler_worker.batch_params: a step's sampling parameters kept between steps, and the
sampler reading them: the same tokens as with each row's parameters read afresh."""

from __future__ import annotations

import torch

from common.sampling_params import SamplingParams
from scheduler_worker.batch_params import BatchParams, BatchParamsCache
from scheduler_worker.sampling import Sampler, SamplingRow

EOS = 2


def test_the_rows_of_each_kind():
    params = [
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=0.7, top_p=0.9, seed=3),
        SamplingParams(temperature=0.0, logit_bias={5: 1.0}),
        SamplingParams(temperature=0.0, presence_penalty=0.5, logprobs=2),
        SamplingParams(temperature=0.0, min_tokens=4),
    ]
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
