"""The sampler's columns kept on the device (logits_processors.DeviceColumns): a column is
reused only while its values are the same, and a sampler that keeps them draws exactly
what a fresh sampler draws, step after step, as rows join, leave and change parameters."""

from __future__ import annotations

import random

import numpy as np
import torch

from common.sampling_params import SamplingParams
from scheduler_worker.logits_processors import DeviceColumns, SamplingRow
from scheduler_worker.sampling import Sampler

VOCAB = 40
CPU = torch.device("cpu")


def test_a_column_is_kept_while_its_values_hold():
    cols = DeviceColumns()
    a = cols.get("t", np.array([0.7, 1.0]), CPU, torch.float32)
    assert a.dtype == torch.float32 and a.tolist() == [0.699999988079071, 1.0]
    assert cols.get("t", np.array([0.7, 1.0]), CPU, torch.float32) is a
    assert cols.reused == 1
    b = cols.get("t", np.array([0.7, 0.9]), CPU, torch.float32)  # a value changed
    assert b is not a and b[1].item() == np.float32(0.9)
    assert cols.get("t", np.array([0.7, 0.9, 1.0]), CPU, torch.float32) is not b  # a row more
    assert cols.get("t", np.array([0.7, 0.9, 1.0]), CPU, torch.float64).dtype == torch.float64
    rows = cols.get("r", [3, 5], CPU, torch.long)
    assert rows.tolist() == [3, 5] and cols.get("r", [3, 5], CPU, torch.long) is rows
    assert cols.get("r", [3, 6], CPU, torch.long).tolist() == [3, 6]
    # the caller's array written after the call: the kept column is the values it was given
    host = np.array([1, 2], dtype=np.int64)
    kept = cols.get("h", host, CPU, torch.long)
    host[0] = 9
    assert kept.tolist() == [1, 2]
    assert cols.get("h", host, CPU, torch.long).tolist() == [9, 2]


def _params(rng: random.Random) -> SamplingParams:
    kw: dict = {"max_tokens": 64, "temperature": rng.choice((0.0, 0.7, 1.0, 1.3))}
    if rng.random() < 0.6:
        kw["top_p"] = rng.choice((0.5, 0.9))
    if rng.random() < 0.2:
        kw["top_k"] = rng.choice((3, 12))
    if rng.random() < 0.2:
        kw["min_p"] = 0.05
    if rng.random() < 0.3:
        kw["seed"] = rng.randrange(1 << 40)
    if rng.random() < 0.2:
        kw["logprobs"] = rng.choice((0, 3))
    if rng.random() < 0.25:
        kw["presence_penalty"] = rng.choice((0.5, -0.25))
    if rng.random() < 0.15:
        kw["repetition_penalty"] = 1.3
    return SamplingParams(**kw)


def test_kept_columns_draw_what_fresh_ones_draw():
    rng = random.Random(3)
    kept = Sampler(VOCAB, [0])
    slots: dict[int, SamplingParams] = {}
    batch: list[int] = []
    for step in range(160):
        if step % 4 == 0:  # a batch holds a few steps (its columns kept), then changes
            for s in rng.sample(range(20), rng.randint(1, 5)):
                slots[s] = _params(rng)
            batch = rng.sample(sorted(slots), rng.randint(1, len(slots)))
        prev = torch.randint(0, VOCAB, (32,), generator=torch.Generator().manual_seed(step))
        rows = []
        for s in batch:
            outs = [rng.randrange(VOCAB) for _ in range(rng.randrange(1, 6))]
            pending = rng.randrange(32) if rng.random() < 0.5 else -1
            if pending >= 0:
                outs.append(-1)
            prompt = [rng.randrange(VOCAB) for _ in range(3)]
            rows.append(SamplingRow(slots[s], prompt, outs, pending, None, (), s))
        logits = torch.randn(len(rows), VOCAB, generator=torch.Generator().manual_seed(step))
        torch.manual_seed(step)  # the unseeded rows' draws
        got = kept.sample(logits.clone(), rows, False, prev).result()
        torch.manual_seed(step)
        want = Sampler(VOCAB, [0]).sample(logits.clone(), rows, False, prev).result()
        assert got.token_ids == want.token_ids, step
        assert got.logprobs == want.logprobs, step
    assert kept.columns.reused > 200  # the steps that kept their batch read kept columns


def test_writable_logits_take_masks_and_penalties_in_place_and_logprobs_stay_raw():
    """The engine hands its step's logits over (writable): grammar masks and penalties go
    into them, not into a copy of the batch, and the rows asking for logprobs still get
    the raw logits' (copied apart first); the tokens and logprobs are those of the
    non-writable path, which leaves the caller's logits untouched."""
    rng = random.Random(5)
    allow = torch.zeros((VOCAB + 31) // 32, dtype=torch.int32)
    allow[0] = 0b1110  # tokens 1, 2, 3 only
    rows = []
    for i in range(12):
        kw: dict = {"max_tokens": 64, "temperature": 0.0 if i % 3 else 0.8, "seed": i}
        if i % 2:
            kw["presence_penalty"] = 2.0
        if i % 4 < 2:
            kw["logprobs"] = 3
        outs = [rng.randrange(VOCAB) for _ in range(6)]
        mask = allow if i % 5 == 0 else None
        rows.append(SamplingRow(SamplingParams(**kw), [1, 2], outs, -1, mask, (), i))
    logits = torch.randn(len(rows), VOCAB, generator=torch.Generator().manual_seed(1))
    given = logits.clone()
    want = Sampler(VOCAB, [0]).sample(given, rows, False).result()
    assert torch.equal(given, logits)  # not writable: untouched
    got = Sampler(VOCAB, [0]).sample(given, rows, True).result()
    assert got.token_ids == want.token_ids and got.logprobs == want.logprobs
    assert not torch.equal(given[1], logits[1])  # a penalized row, written in place
    assert torch.equal(given[2], logits[2])  # a row with nothing to apply
    masked = [i for i in range(len(rows)) if i % 5 == 0]
    assert all(got.token_ids[i] in (1, 2, 3) for i in masked)
    # row 0: masked, asks for logprobs: the raw logits' (its mask in `given` did not reach them)
    raw = logits[0].log_softmax(-1)
    assert got.logprobs[0] is not None
    assert got.logprobs[0].logprob == raw[got.token_ids[0]].item()
    assert got.logprobs[0].top_ids == raw.topk(3).indices.tolist()
