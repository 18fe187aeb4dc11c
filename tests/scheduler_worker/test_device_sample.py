"""DeviceSample.result builds a step's TokenLogprobs in C passes: each equals the one the
row-by-row loop made (its token, its logprob, its own top-N cut of the step's widest)."""

from __future__ import annotations

import random

import torch

from scheduler_worker.sampling import DeviceSample, TokenLogprobs


def _row_by_row(sample: DeviceSample) -> list[TokenLogprobs | None]:
    tokens = sample.token_ids.tolist()
    sampled = [] if sample.sampled_logprobs is None else sample.sampled_logprobs.tolist()
    ids = [] if sample.top_ids is None else sample.top_ids.tolist()
    lps = [] if sample.top_logprobs is None else sample.top_logprobs.tolist()
    out: list[TokenLogprobs | None] = [None] * len(tokens)
    for j, (i, k) in enumerate(zip(sample.logprob_rows, sample.num_top)):
        top_ids, top_lps = (ids[j][:k], lps[j][:k]) if ids else ([], [])
        out[i] = TokenLogprobs(tokens[i], sampled[j], top_ids, top_lps)
    return out


def test_a_steps_logprobs_equal_the_row_by_row_build():
    rng = random.Random(2)
    for _ in range(300):
        n = rng.randint(1, 40)
        rows = sorted(rng.sample(range(n), rng.randint(0, n)))
        num_top = [rng.choice((0, 0, 1, 5, 20)) for _ in rows]
        tokens = torch.randint(0, 1000, (n,))
        sample = DeviceSample(tokens, rows, num_top)
        if rows:
            sample.sampled_logprobs = -torch.rand(len(rows))
            width = max(num_top)
            if width:
                sample.top_logprobs = -torch.rand(len(rows), width)
                sample.top_ids = torch.randint(0, 1000, (len(rows), width))
        want = _row_by_row(sample)
        got = sample.result()
        assert got.token_ids == tokens.tolist()
        assert got.logprobs == want
        assert [type(x) for x in got.logprobs] == [type(x) for x in want]
        for lp, i in zip(map(got.logprobs.__getitem__, rows), rows):
            assert lp is not None and lp.token_id == tokens[i] and len(lp.top_ids) <= 20
