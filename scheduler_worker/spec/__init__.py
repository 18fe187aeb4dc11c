"""Speculative decoding's drafting seam: a drafter proposes up to k next tokens for a
request from its own tokens; the scheduler gives the row a (1 + k)-token chunk and the
engine verifies every draft in the step's one batched forward: by argmax for plain greedy
rows (verify.py), by sampling each position for the others (sampled.py).

    method  file       drafts from
    ngram   ngram.py   the request's prompt and output (prompt lookup)

A drafter keeps its per-request state on the request (Request.draft_state), so that
it goes with the request through preemption and is dropped when the request is.
"""

from __future__ import annotations

from typing import Protocol

from common.config import ConfigError
from scheduler_worker.spec.ngram import NgramDrafter


class Drafter(Protocol):
    def propose(
        self, token_ids: list[int], state: object | None, k: int
    ) -> tuple[list[int], object]:
        """Up to k tokens likely to follow token_ids (all known: no placeholder), and the
        request's drafter state for the next call (`state`: the last call's, None at first)."""
        ...


def make_drafter(method: str) -> Drafter | None:
    """The drafter of --speculative-method; None: no speculation."""
    if method == "none":
        return None
    if method == "ngram":
        return NgramDrafter()
    raise ConfigError(f"unknown speculative method {method!r}")
