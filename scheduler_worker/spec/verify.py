"""Verifying a step's drafts, greedy and exact: a drafted row's chunk is [its last token,
d1..dk] and the forward gives the logits at each, so its argmaxes t0..tk are the tokens
one-by-one decoding would have sampled as long as the drafts agree: d_i == t_(i-1) for
i <= m means t0..tm are its next m + 1 tokens (m accepted drafts, then one more).

    chunk     [ last | d1 | d2 | d3 ]
    argmax    [  t0  | t1 | t2 | t3 ]     d1 == t0, d2 != t1: tokens t0, t1 (m = 1)

A row with a grammar takes each argmax of its logits masked by the grammar's state after
the drafts before it (GrammarMatchers.check_drafts made the masks, its drafts cut where
the grammar refuses one): the token one-by-one constrained decoding would have taken.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from scheduler_worker.logits_processors import SamplingRow, apply_token_masks
from scheduler_worker.request import Request, RequestStatus
from scheduler_worker.sampling import TokenLogprobs, greedy_tokens
from scheduler_worker.spec.policy import verified
from scheduler_worker.step_output import EngineCounters, RequestOutput, request_output

if TYPE_CHECKING:
    from scheduler_worker.scheduler import Scheduler
    from scheduler_worker.structured import GrammarMatchers


def draft_targets(
    entries: list[tuple[Request, int]],
    prompt_logits: list[torch.Tensor | None],
    drafts: dict[str, list[int]],
    vocab_size: int,
    masks: dict[str, torch.Tensor] | None = None,
    isa: int | None = None,
) -> dict[str, list[int]]:
    """The argmax t0..t(k-1) at each drafted row's leading k positions (the step's last
    position's, tk, is the row's sampled token); `masks`: a constrained row's packed
    masks [1 + k, W] (the sampler's op applies them: `isa` as there). Takes those rows'
    logits out of prompt_logits (they are no prompt logprobs)."""
    targets: dict[str, list[int]] = {}
    for i, (req, _) in enumerate(entries):
        rows = prompt_logits[i]
        if rows is not None and req.request_id in drafts:
            if rows.dtype != torch.long:  # logits, not the head's argmax (same as greedy)
                rows = rows[:, :vocab_size]
                words = masks.get(req.request_id) if masks else None
                if words is not None:
                    masked = [SamplingRow(req.params, (), (), -1, w) for w in words[:-1]]
                    rows = apply_token_masks(rows, masked, isa, in_place=True)
                rows = greedy_tokens(rows)
            targets[req.request_id] = rows.tolist()
            prompt_logits[i] = None
    return targets


def accepted_tokens(drafts: list[int], targets: list[int], last: int) -> list[int]:
    """The row's next tokens: t0..tm, m the longest run of drafts equal to the targets
    (`last`: tk, the argmax after the last draft)."""
    full = [*targets, last]
    m = 0
    while m < len(drafts) and drafts[m] == full[m]:
        m += 1
    return full[: m + 1]


def verified_output(
    scheduler: Scheduler,
    grammars: GrammarMatchers,
    counters: EngineCounters,
    req: Request,
    index: int,
    token: int,
    lp: TokenLogprobs | None,
    drafts: list[int],
    targets: list[int],
    lps: list[TokenLogprobs | None] | None = None,
) -> RequestOutput:
    """The output of a row that verified drafts, its tokens taken (token, lp: its sample
    after the last; lps: the logprobs of targets, for a row that asked for them)."""
    tokens, done = accepted_tokens(drafts, targets, token), False
    if req.request_id in grammars:  # its matcher takes exactly the tokens kept
        tokens, done = grammars.advance_all(req, tokens)
    kept = scheduler.accept(req, index, tokens)
    if done and not req.status.finished:  # grammar complete at its last kept token
        scheduler.finish_at(req, index + len(kept) - 1, RequestStatus.FINISHED_STOPPED)
    verified(req, len(drafts), len(kept) - 1, counters)
    logprobs = None if lp is None or lps is None else [*lps, lp][: len(kept)]
    return request_output(req, kept, logprobs)
