"""Verifying the drafts of rows that are not plain greedy (temperature, top-k/p, min-p, a
seed, logprobs, logit_bias, min_tokens, penalties), exact in distribution.

A draft is a point mass, so rejection sampling (Leviathan et al.) with draft d at a
position whose target distribution is p reads: sample t ~ p; accept d iff t == d (with
probability p(d)); on a rejection the token is t, which is then distributed as p with d
taken out and renormalized (the residual max(0, p - q) for q the point mass on d). So each
position of the (1 + k)-token chunk is sampled as one-by-one decoding would have sampled
it, with the row's own parameters and the uniforms of that output index:

    chunk     [ last | d1 | d2 | d3 ]
    sampled   [  t0  | t1 | t2 | t3 ]     t0 == d1, t1 != d2: tokens t0, t1 (then stop)
    counter      n    n+1  n+2  n+3       (the seed's, and min_tokens' count of outputs)

Position j's history is the row's outputs then d1..dj (SamplingRow.draft_token_ids), which
are its real outputs whenever position j is reached: its seed counter, min_tokens mask
and penalties read them. A seeded row thus gives the same tokens with and without
drafts; an unseeded one draws each position from the engine's generator.

Every drafted row's leading k positions are sampled in one Sampler.sample call over the
step (positions stacked as rows); the last position is the row's ordinary sample, given
all its drafts as history (LLMEngine._launch).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import torch

from scheduler_worker.request import Request
from scheduler_worker.sampling import DeviceSample, Sampler, SamplingRow, TokenLogprobs


@dataclass
class SampledVerify:
    """The sampled tokens at the verify positions of a step's drafted rows, on the device."""

    sample: DeviceSample  # one row a position, the rows' positions in `spans` order
    spans: dict[str, tuple[list[int], int]]  # rid -> (its drafts, its first position)

    def targets(self) -> dict[str, tuple[list[int], list[int], list[TokenLogprobs | None]]]:
        """rid -> (drafts, t0..t(k-1), their logprobs): on the host (waits for the copy)."""
        out = self.sample.result()  # each logprobs row's TokenLogprobs (not kept)
        tokens, lps = out.token_ids, cast(list[TokenLogprobs | None], out.logprobs)
        return {
            rid: (drafts, tokens[a : a + len(drafts)], lps[a : a + len(drafts)])
            for rid, (drafts, a) in self.spans.items()
        }


def sample_drafts(
    sampler: Sampler,
    entries: list[tuple[Request, int]],
    prompt_logits: list[torch.Tensor | None],
    drafts: dict[str, list[int]],
) -> SampledVerify | None:
    """Sample the leading k positions of each drafted row that is not greedy (plain or
    under a grammar: those verify by argmax, verify.draft_targets); takes their logits
    out of prompt_logits."""
    pieces: list[torch.Tensor] = []
    rows: list[SamplingRow] = []
    spans: dict[str, tuple[list[int], int]] = {}
    for i, (req, _) in enumerate(entries):
        logits = prompt_logits[i]
        if logits is None or req.request_id not in drafts or req.plain:
            continue
        if req.params.structured is not None:  # greedy under a grammar: verify.draft_targets
            continue
        d = drafts[req.request_id]
        spans[req.request_id] = (d, len(rows))
        p, prompt, out = req.params, req.prompt_token_ids, req.output_token_ids
        rows += [SamplingRow(p, prompt, out, -1, None, d[:j], req.slot) for j in range(len(d))]
        pieces.append(logits)
        prompt_logits[i] = None
    if not rows:
        return None
    stacked = pieces[0] if len(pieces) == 1 else torch.cat(pieces)
    return SampledVerify(sampler.sample(stacked, rows, True).start_copy(), spans)
