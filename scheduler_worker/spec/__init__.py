"""Speculative decoding's drafting seam: a drafter proposes up to k next tokens for a
request from its own tokens; the scheduler gives the row a (1 + k)-token chunk and the
engine verifies every draft in the step's one batched forward: by argmax for plain greedy
rows (verify.py), by sampling each position for the others (sampled.py).

    method  file       drafts from
    ngram   ngram.py   the request's prompt and output (prompt lookup)
    (any)   prediction.py  the request's OpenAI `prediction`, aligned with its output
    suffix  suffix.py  the same and a bounded store of recent requests' outputs, shared
                       by the scheduler process's requests (observe() feeds it)

A drafter keeps its per-request state on the request (Request.draft_state), so that
it goes with the request through preemption and is dropped when the request is.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from common.config import ConfigError
from scheduler_worker.spec.ngram import NgramDrafter
from scheduler_worker.spec.suffix import SuffixDrafter

if TYPE_CHECKING:
    from scheduler_worker.request import Request


class Drafter(Protocol):
    def propose(
        self, token_ids: list[int], state: object | None, k: int
    ) -> tuple[list[int], object]:
        """Up to k tokens likely to follow token_ids (all known: no placeholder), and the
        request's drafter state for the next call (`state`: the last call's, None at first)."""
        ...

    def observe(self, prompt_token_ids: list[int], output_token_ids: list[int]) -> None:
        """A request finished (or was aborted) with these tokens: a drafter that learns
        across requests keeps them."""
        ...


def propose(req: Request, drafter: Drafter | None, k: int) -> list[int]:
    """Up to k drafts for req: from its prediction (prediction.py) first, whatever the
    method; where that has none, from the server's drafter (its state kept on req)."""
    drafts = [] if req.prediction is None else req.prediction.propose(req.token_ids, k)
    if not drafts and drafter is not None:
        drafts, req.draft_state = drafter.propose(req.token_ids, req.draft_state, k)
    return drafts


def make_drafter(method: str) -> Drafter | None:
    """The drafter of --speculative-method; None: no speculation."""
    if method == "none":
        return None
    if method == "ngram":
        return NgramDrafter()
    if method == "suffix":
        return SuffixDrafter()
    raise ConfigError(f"unknown speculative method {method!r}")
