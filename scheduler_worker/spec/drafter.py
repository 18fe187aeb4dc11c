"""The drafters' interfaces (spec/__init__.py tells the seam): Drafter, what every
drafter answers, and ModelDrafter, the base of a drafter that runs a model over a step's
rows in one batch (the draft model; an EAGLE head or MTP, a file each)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from scheduler_worker.request import Request
    from scheduler_worker.scheduled_batch import ScheduledBatch

RESERVED = -1  # a ModelDrafter's draft to come (fill), never a token of a step


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


class ModelDrafter(ABC):
    """A drafter that runs a model over the step's rows in one batch (module docstring);
    `first`: a cheaper drafter asked first (ngram, suffix), the model only where it has
    nothing."""

    def __init__(self, first: Drafter | None) -> None:
        self.first = first

    def propose(
        self, token_ids: list[int], state: object | None, k: int
    ) -> tuple[list[int], object | None]:
        if self.first is not None:
            drafts, state = self.first.propose(token_ids, state, k)
            if drafts:
                return drafts, state
        return [RESERVED] * k, state

    def observe(self, prompt_token_ids: list[int], output_token_ids: list[int]) -> None:
        if self.first is not None:
            self.first.observe(prompt_token_ids, output_token_ids)

    def fill(self, batch: ScheduledBatch) -> None:
        """The reserved rows' drafts (as many as reserved at most; none where the model
        has none: a plain decode row then), all at once."""
        rows = [(batch.entries[r][0], len(d)) for r, d in batch.drafts.items() if d[0] == RESERVED]
        if not rows:
            return
        for (req, _), drafts in zip(rows, self.propose_batch(rows)):
            batch.drafts[req.request_id] = drafts
            batch.cut_drafts(req, len(drafts))

    @abstractmethod
    def propose_batch(self, rows: list[tuple[Request, int]]) -> list[list[int]]:
        """Up to k drafts for each (running decode row, k), in one batch."""

    @abstractmethod
    def live(self, req: Request) -> bool:
        """The model drafts for req already (its draft state is kept): drafting for it
        costs only the tokens since its last proposal."""

    @abstractmethod
    def drop(self, req: Request) -> None:
        """req stopped running: its state (its draft KV) goes."""
