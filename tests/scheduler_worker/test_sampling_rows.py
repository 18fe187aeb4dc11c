"""Each request keeps its SamplingRow between steps (logits_processors.sampling_rows brings
it up to the step): at every step it equals the row made afresh from the
request, as the per-step build made it, whatever a past step set on it."""

from __future__ import annotations

import random

import torch

from common.sampling_params import SamplingParams
from scheduler_worker.logits_processors import SamplingRow, sampling_rows
from scheduler_worker.request import Request


def _fresh(req: Request) -> SamplingRow:
    """The row as the per-step build made it (the reference)."""
    pending = req.flight_row if req.num_pending > 0 else -1
    return SamplingRow(
        req.params, req.prompt_token_ids, req.output_token_ids, pending, None, (), req.slot
    )


def test_kept_rows_equal_fresh_ones_step_after_step():
    rng = random.Random(3)
    params = [
        SamplingParams(max_tokens=50, temperature=0.7, top_p=0.9, seed=i if i % 4 == 1 else None)
        for i in range(12)
    ]
    reqs = [Request(f"r{i}", [5 + i, 6, 7], params[i]) for i in range(12)]
    checked = 0
    for _ in range(200):
        batch = rng.sample(reqs, rng.randint(1, len(reqs)))  # rows join and leave
        for req in batch:  # what a step may change: pending tokens, its slot, its outputs
            req.num_pending = rng.choice((0, 0, 1))
            req.flight_row = rng.randrange(64)
            req.slot = rng.randrange(16) if rng.random() < 0.1 else req.slot
            if rng.random() < 0.5:
                req.append_token(rng.randrange(100))
        rows = sampling_rows(batch)
        for row, req in zip(rows, batch, strict=True):
            assert row == _fresh(req)
            assert row.output_token_ids is req.output_token_ids  # the request's, read live
            checked += 1
        for row in rows:  # what the engine sets on a step's rows (grammar masks, drafts)
            if rng.random() < 0.2:
                row.token_bitmask = torch.full((2,), -1, dtype=torch.int32)
            if rng.random() < 0.2:
                row.draft_token_ids = [rng.randrange(100)]
    assert checked > 1000
    assert sampling_rows([]) == []
