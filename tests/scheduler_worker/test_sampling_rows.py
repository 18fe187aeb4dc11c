"""A request is the sampler's row (logits_processors.SampledRow): at every step it reads as
the row made by hand from it, whatever a past step set; what the engine sets on it for one
step (a grammar mask, drafts) is cleared at its next launch; and the sampler's batch
parameters are kept for the same rows, rebuilt when a row changes."""

from __future__ import annotations

import random

import torch

from common.sampling_params import SamplingParams
from scheduler_worker.batch_params import BatchParamsCache
from scheduler_worker.logits_processors import SamplingRow
from scheduler_worker.request import Request, mark_drafts, mark_masks, unmark

FIELDS = ("params", "prompt_token_ids", "output_token_ids", "pending_row", "slot")


def _fresh(req: Request) -> SamplingRow:
    """The row as the per-step build made it (the reference)."""
    pending = req.flight_row if req.num_pending > 0 else -1
    return SamplingRow(
        req.params, req.prompt_token_ids, req.output_token_ids, pending, None, (), req.slot
    )


def test_requests_read_as_fresh_rows_and_step_marks_are_cleared_at_the_next_launch():
    rng = random.Random(3)
    params = [
        SamplingParams(max_tokens=50, temperature=0.7, top_p=0.9, seed=i if i % 4 == 1 else None)
        for i in range(12)
    ]
    reqs = [Request(f"r{i}", [5 + i, 6, 7], params[i]) for i in range(12)]
    marked: list[Request] = []
    checked = 0
    for _ in range(200):
        marked = unmark(marked)  # the launch's first act (LLMEngine._launch)
        batch = rng.sample(reqs, rng.randint(1, len(reqs)))  # rows join and leave
        for req in batch:  # what a step may change: pending tokens, its slot, its outputs
            req.num_pending = rng.choice((0, 0, 1))
            req.flight_row = rng.randrange(64)
            req.slot = rng.randrange(16) if rng.random() < 0.1 else req.slot
            if rng.random() < 0.5:
                req.append_token(rng.randrange(100))
        for req in reqs:  # none carries a mask or drafts of a past step
            fresh = _fresh(req)
            assert all(getattr(req, f) == getattr(fresh, f) for f in FIELDS)
            assert req.token_bitmask is None and req.draft_token_ids == ()
            checked += 1
        drafts = {r.request_id: [rng.randrange(100)] for r in batch if rng.random() < 0.2}
        marked = mark_drafts(batch, drafts)
        assert {r.request_id for r in marked} == set(drafts)
        assert all(r.draft_token_ids == drafts.get(r.request_id, ()) for r in batch)
        masks = {i: torch.full((2,), -1, dtype=torch.int32) for i in range(len(batch))}
        masks = {i: w for i, w in masks.items() if rng.random() < 0.2}
        assert mark_masks(batch, masks, marked) == list(masks)
        assert all((r.token_bitmask is masks.get(i)) for i, r in enumerate(batch))
    assert checked > 2000


def test_batch_params_are_kept_for_the_same_rows_and_rebuilt_when_one_changes():
    sampled = SamplingParams(max_tokens=8, temperature=0.7, top_p=0.9)
    greedy = SamplingParams(max_tokens=8, temperature=0.0, presence_penalty=0.5)
    reqs = [Request(f"r{i}", [1, 2], sampled if i % 2 else greedy) for i in range(6)]
    for i, req in enumerate(reqs):
        req.slot = i
    cache = BatchParamsCache()
    first = cache.of_rows(reqs)
    assert cache.of_rows(list(reqs)) is first  # the same rows, another list
    assert first.draws == [1, 3, 5] and first.penalized == [0, 2, 4]
    other = Request("r0", [1, 2], sampled)  # a new request in slot 0: same id, new row
    other.slot = 0
    rows = [other, *reqs[1:]]
    again = cache.of_rows(rows)
    assert again.draws == [0, 1, 3, 5] and again.penalized == [2, 4]
    cache.get([r.params for r in reqs])  # the cache's last set apart from its rows
    assert cache.of_rows(rows).draws == [0, 1, 3, 5]  # never another rows' parameters


def test_a_kept_batch_sends_the_keys_a_fresh_one_sends_step_after_step():
    """The draw op's columns and seeds kept with the batch's parameters (BatchParams.memo):
    over steps of the same rows, outputs growing, the keyed op gets the same rows, numbers
    and seeded rows' keys as a sampler that derives them afresh each step."""
    from scheduler_worker.backends.base import DrawRows
    from scheduler_worker.sampling import Sampler

    seen: list[list] = []

    def op(logits, draw, params, keys):
        seen.append([draw.tolist(), params.tolist(), keys.tolist()])
        return logits.argmax(dim=-1)

    keyed = DrawRows(op, keyed=True, device="cpu")
    kinds = [
        {"temperature": 0.8, "top_p": 0.9, "seed": 7},
        {"temperature": 0.0},
        {"temperature": 1.0, "top_k": 20},
        {"temperature": 0.7, "seed": -(2**40) - 3},
        {"temperature": 0.7, "seed": 2**63 - 1},
    ]
    reqs = [
        Request(f"r{i}", [1, 2], SamplingParams(max_tokens=64, **kw)) for i, kw in enumerate(kinds)
    ]
    for i, req in enumerate(reqs):
        req.slot = i
    kept = Sampler(100, [], None, keyed)
    logits = torch.randn(len(reqs), 100, generator=torch.Generator().manual_seed(1))
    for step in range(4):
        kept(logits.clone(), reqs)
        Sampler(100, [], None, keyed)(logits.clone(), reqs)
        (draw_a, params_a, keys_a), (draw_b, params_b, keys_b) = seen[-2:]
        assert draw_a == draw_b == [0, -1, 1, 2, 3] and params_a == params_b
        seeded = [0, 2, 3]  # among the drawing rows
        assert [keys_a[i] for i in seeded] == [keys_b[i] for i in seeded]
        if step:  # a seeded row's key moves with its token count
            assert keys_a[0] != seen[-4][2][0]
        for req in reqs:
            req.append_token(5)
    assert kept.batch.last is not None and "draw" in kept.batch.last.memo


def test_kept_penalty_columns_give_the_per_row_penalties_step_after_step():
    """PenaltyColumns kept with the batch (BatchParams.memo) over steps of the same rows,
    their outputs growing and a token in flight: the logits of the per-row path each step."""
    from scheduler_worker.penalties import apply_penalties
    from scheduler_worker.penalty_counts import PenaltyCounts

    kinds = [
        {"presence_penalty": 0.5},
        {"temperature": 0.7},
        {"frequency_penalty": 0.3, "repetition_penalty": 1.3},
        {"repetition_penalty": 0.8},
    ]
    reqs = [
        Request(f"r{i}", [3, 4 + i], SamplingParams(max_tokens=64, **kw))
        for i, kw in enumerate(kinds)
    ]
    for i, req in enumerate(reqs):
        req.slot = i
    cache, pool = BatchParamsCache(), PenaltyCounts()
    rng = random.Random(5)
    for step in range(6):
        bp = cache.of_rows(reqs)
        prev = torch.tensor([rng.randrange(20) for _ in reqs])
        for i, req in enumerate(reqs):  # the step in flight's token is its last output
            req.num_pending, req.flight_row = step % 2, i
        logits = torch.randn(len(reqs), 20, generator=torch.Generator().manual_seed(step))
        args = (bp.penalized, bp.values, pool, None, False, bp.memo)
        kept = apply_penalties(logits, reqs, prev, *args)
        assert torch.equal(kept, apply_penalties(logits, reqs, prev))
        assert "penalty" in bp.memo and cache.of_rows(reqs) is bp
        for req in reqs:
            if req.num_pending:
                req.output_token_ids[-1] = req.token_ids[-1] = int(prev[req.flight_row])
            req.num_pending = 0
            req.append_token(rng.randrange(20))
            if step % 2 == 0:
                req.append_token(-1)  # a placeholder the next step fills
