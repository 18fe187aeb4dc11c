"""Penalties read from the sampler's per-slot columns (batch_params' REPETITION, PRESENCE,
FREQUENCY, the rows' tokens found in C passes) give the logits the per-row path gives:
rows joining and leaving slots, tokens in flight, drafts, all three penalties."""

from __future__ import annotations

import random
from collections import Counter

import torch

from common.sampling_params import SamplingParams
from scheduler_worker.batch_params import BatchParamsCache
from scheduler_worker.logits_processors import SamplingRow
from scheduler_worker.penalties import apply_penalties
from scheduler_worker.sampling import Sampler

VOCAB = 30


def _reference(logits: torch.Tensor, rows: list[SamplingRow], prev: torch.Tensor) -> torch.Tensor:
    """Each row on its own, in Python: the tokens it has seen (prompt, outputs, drafts, the
    one in flight) and its output counts."""
    out = logits.clone()
    for i, r in enumerate(rows):
        p = r.params
        flying = [] if r.pending_row < 0 else [int(prev[r.pending_row])]
        outputs = [t for t in [*r.output_token_ids, *r.draft_token_ids] if t >= 0] + flying
        row = out[i : i + 1].clone()
        if p.repetition_penalty != 1.0:
            rep = torch.tensor([[p.repetition_penalty]])
            seen = torch.zeros_like(row, dtype=torch.bool)
            for t in {*r.prompt_token_ids, *outputs}:
                seen[0, t] = True
            row = torch.where(seen, torch.where(row > 0, row / rep, row * rep), row)
        if p.presence_penalty or p.frequency_penalty:
            counts = torch.zeros_like(row)
            for t, c in Counter(outputs).items():
                counts[0, t] = c
            pres, freq = torch.tensor([[p.presence_penalty]]), torch.tensor([[p.frequency_penalty]])
            row = row - pres * (counts > 0).to(row.dtype) - freq * counts
        out[i : i + 1] = row
    return out


def _params(rng: random.Random) -> SamplingParams:
    kind = rng.randrange(5)
    return SamplingParams(
        max_tokens=64,
        temperature=rng.choice((0.0, 0.7)),
        repetition_penalty=rng.choice((1.0, 1.3)) if kind in (0, 1) else 1.0,
        presence_penalty=rng.choice((0.0, 0.5, -0.25)) if kind in (1, 2) else 0.0,
        frequency_penalty=rng.choice((0.0, 0.4)) if kind in (2, 3) else 0.0,
    )


def test_slot_columns_give_the_per_row_penalties():
    rng = random.Random(7)
    cache, sampler = BatchParamsCache(), Sampler(VOCAB, [0])
    slots: dict[int, SamplingParams] = {}
    penalized = 0
    for step in range(150):
        for s in rng.sample(range(24), rng.randint(0, 4)):  # rows leave, others join
            slots[s] = _params(rng)
        batch = rng.sample(sorted(slots), rng.randint(1, len(slots) or 1)) if slots else []
        if not batch:
            slots[0] = _params(rng)
            batch = [0]
        prev = torch.randint(0, VOCAB, (64,), generator=torch.Generator().manual_seed(step))
        rows = []
        for s in batch:
            outs = [rng.randrange(VOCAB) for _ in range(rng.randrange(6))]
            pending = rng.randrange(64) if rng.random() < 0.5 else -1
            if pending >= 0:
                outs.append(-1)  # its placeholder
            drafts = [rng.randrange(VOCAB)] if rng.random() < 0.1 else []
            prompt = [rng.randrange(VOCAB) for _ in range(3)]
            rows.append(SamplingRow(slots[s], prompt, outs, pending, None, drafts, s))
        logits = torch.randn(len(rows), VOCAB, generator=torch.Generator().manual_seed(step))
        bp = cache.get([r.params for r in rows], [r.slot for r in rows])
        fast = apply_penalties(logits, rows, prev, bp.penalized, bp.values)
        slow = apply_penalties(logits, rows, prev)
        assert torch.equal(fast, slow)
        torch.testing.assert_close(fast, _reference(logits, rows, prev), rtol=0, atol=1e-6)
        # and through the sampler (its greedy rows: the penalized logits' argmax)
        greedy = [i for i, r in enumerate(rows) if r.params.temperature == 0.0]
        got = sampler.sample(logits.clone(), rows, False, prev).result().token_ids
        assert [got[i] for i in greedy] == fast[greedy].argmax(dim=-1).tolist()
        penalized += len(bp.penalized)
    assert penalized > 300
