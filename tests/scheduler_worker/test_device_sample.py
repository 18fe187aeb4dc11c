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


def test_kept_rows_are_the_same_logprobs_and_pack_to_the_same_bytes():
    """result(kept=True): each logprobs row a RowLogprobs into the step's arrays, whose
    TokenLogprobs equal result()'s, and whose bytes (StepLogprobs.pack, any rows of the
    block in any message rows) equal pack_token_logprobs' of those lists."""
    from common.messages.scheduler_detok import pack_token_logprobs
    from scheduler_worker.step_logprobs import RowLogprobs, token_logprobs

    rng = random.Random(3)
    for _ in range(300):
        n = rng.randint(1, 40)
        rows = sorted(rng.sample(range(n), rng.randint(1, n)))
        num_top = [rng.choice((0, 0, 1, 5, 20)) if rng.random() < 0.3 else 5 for _ in rows]
        tokens = torch.randint(0, 50_000, (n,))
        sample = DeviceSample(tokens, rows, num_top, -torch.rand(len(rows)) * 30)
        if max(num_top):
            sample.top_logprobs = -torch.rand(len(rows), max(num_top)) * 30
            sample.top_ids = torch.randint(0, 50_000, (len(rows), max(num_top)))
        want = sample.result().logprobs
        sample._host = None
        got = sample.result(kept=True)
        assert got.token_ids == tokens.tolist()
        assert [x is None for x in got.logprobs] == [x is None for x in want]
        kept = [x for x in got.logprobs if x is not None]
        assert all(type(x) is RowLogprobs for x in kept)
        assert list(map(token_logprobs, got.logprobs)) == want
        # a message's rows: some of the block's, at other rows
        pick = sorted(rng.sample(range(len(rows)), rng.randint(1, len(rows))))
        at = sorted(rng.sample(range(3 * n), len(pick)))
        lists = [token_logprobs(kept[i]) for i in pick]
        assert all(x is not None for x in lists)
        args = [x[1] for x in lists], [x[2] for x in lists], [x[3] for x in lists]  # type: ignore[index]
        assert kept[0].block.pack(at, pick) == pack_token_logprobs(at, *args)
