"""A request as the engine sees it: token ids, KV blocks, progress, status.

    token_ids:  [ prompt ............................ | output ...... ]
    KV cache:   [ prefix-cache hit | computed by us   | not yet computed ]
                0          num_cached_tokens   num_computed_tokens     num_tokens
    blocks:     block_table covers at least num_computed_tokens tokens; the first
                num_hashed_blocks of them are registered in the prefix cache; with a
                sliding-window model, the first num_freed_blocks entries were given back
                (the scheduler's placeholder block stands in their place).

A request samples a token in a step whose chunk reaches num_tokens (the last prompt
chunk, then every decode).
"""

from __future__ import annotations

import enum
import time
from collections.abc import Mapping, Sequence
from dataclasses import InitVar, dataclass, field
from typing import TYPE_CHECKING

from common.sampling_params import SamplingParams
from scheduler_worker.batch_params import has_penalty
from scheduler_worker.sampling import plain_greedy_params
from scheduler_worker.spec.prediction import Prediction

if TYPE_CHECKING:
    import torch

# a token still being sampled on the device (overlapped scheduling: Scheduler.advance)
PLACEHOLDER = -1


class RequestStatus(enum.Enum):
    WAITING = "waiting"  # queued (new, or preempted back) and holding no blocks
    RUNNING = "running"  # holding blocks: prefilling or decoding
    FINISHED_STOPPED = "stop"
    FINISHED_LENGTH = "length"
    FINISHED_ABORTED = "abort"

    def __init__(self, value: str) -> None:
        # a plain attribute, not a property: read several times a row a step
        self.finished = value not in ("waiting", "running")


@dataclass(eq=False, slots=True)
class Request:
    """Slots: its fields are read for every row of every step. As a plain class its 37
    attributes passed CPython's 30 for an instance's inline values, so each read was a dict
    lookup (LOAD_ATTR_WITH_HINT) and each request carried a dict of its own."""

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    arrival_time: float = field(default_factory=time.monotonic)
    token_ids: list[int] = field(init=False)
    status: RequestStatus = RequestStatus.WAITING
    block_table: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    num_cached_tokens: int = 0  # prefix-cache hit at (latest) admission
    num_hashed_blocks: int = 0
    num_freed_blocks: int = 0  # leading block_table entries given back (sliding window)
    slot: int = -1  # its row of the scheduler's BlockTables while running
    flight_row: int = -1  # with num_pending: its placeholder's row in the step in flight
    # the tokens that may stop it (stop_token_ids, and the EOS unless ignore_eos): set by
    # Scheduler.add, read for every token it samples
    stop_tokens: frozenset[int] = frozenset()
    num_preemptions: int = 0
    in_prefill_queue: bool = False
    num_pending: int = 0  # placeholder tokens at the end of token_ids (Scheduler.advance)
    stop_token_id: int | None = None  # the stop_token_ids entry that finished it
    # params.prompt_logprobs: per prompt position, [token id, logprob, [[id, logprob], ...]]
    # (position 0: logprob None), filled chunk by chunk, sent with the first output
    prompt_logprobs: list[list | None] | None = None
    prompt_logprobs_sent: bool = False
    # speculative decoding (scheduler_worker/spec/): the drafter's state, and the tokens
    # drafted / accepted so far
    draft_state: object | None = None
    # OpenAI's `prediction` (spec/prediction.py): drafts from it, and its usage counts
    prediction: Prediction | None = None
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    spec_accepted: float = 0.0  # recent verifies, decayed (spec/policy.py: its acceptance)
    spec_refused: float = 0.0
    # the sampler's row (logits_processors.SampledRow): the request is its own, so a step
    # copies nothing a row. The engine sets these two on the rows that have them for a
    # step, and clears them at its next launch
    token_bitmask: torch.Tensor | None = None  # this step's grammar mask
    draft_token_ids: Sequence[int] = ()  # this step's drafts
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    finished_time: float | None = None
    prediction_token_ids: InitVar[Sequence[int] | None] = None  # makes `prediction`
    # set by __post_init__, from the above
    num_prompt_tokens: int = field(init=False)
    output_token_ids: list[int] = field(init=False)
    max_tokens: int = field(init=False)
    plain: bool = field(init=False)
    reads_history: bool = field(init=False)
    resolves_apart: bool = field(init=False)
    speculates: bool = field(init=False)
    # running, its first token out, not resolves_apart: its token may resolve in the loops'
    # common path (resolve_rows.py), one test where three were; kept by the Scheduler where
    # status or first_token_time change
    resolves_inline: bool = False

    def __post_init__(self, prediction_token_ids: Sequence[int] | None) -> None:
        self.token_ids = list(self.prompt_token_ids)
        self.num_prompt_tokens = len(self.prompt_token_ids)
        if prediction_token_ids is not None:
            self.prediction = Prediction(list(prediction_token_ids), self.num_prompt_tokens)
        # kept beside token_ids (not sliced from it) so that reading it every step is O(1):
        # the sampler's penalties and min_tokens read it for every sampled row
        self.output_token_ids = []
        if self.params.max_tokens is None:  # LLMEngine.add_request settles it first
            raise ValueError("a request's max_tokens must be settled before it is queued")
        self.max_tokens = self.params.max_tokens
        # settled once, read for every row of every step (LLMEngine._launch): `plain` rows
        # need only their argmax (never the sampler's rows); only `reads_history` rows may
        # read their tokens on the host before they sample (a grammar, penalties, prompt
        # logprobs)
        p = self.params
        greedy = plain_greedy_params(p) and p.min_tokens == 0
        self.plain = greedy and p.structured is None
        self.reads_history = (
            p.structured is not None or has_penalty(p) or p.prompt_logprobs is not None
        )
        # its sampled tokens go through the engine (a grammar advances; prompt logprobs go
        # with the first output), never resolve_rows' inline loop
        self.resolves_apart = p.structured is not None or p.prompt_logprobs is not None
        # a greedy row verifies drafts by argmax (spec/verify.py; with a grammar, of the
        # masked logits: GrammarMatchers.check_drafts), the others by sampling every
        # position (spec/sampled.py); a sampled row with a grammar drafts nothing yet
        self.speculates = p.speculative and (
            p.structured is None or greedy and p.prompt_logprobs is None
        )

    def append_token(self, token: int) -> None:
        self.token_ids.append(token)
        self.output_token_ids.append(token)

    @property
    def wants_prompt_logprobs(self) -> bool:
        """Its prompt logprobs are still to be computed: no prefix cache for it, then."""
        return self.params.prompt_logprobs is not None and not self.prompt_logprobs_sent

    @property
    def pending_row(self) -> int:
        """Its row in the step in flight, where its last output is that step's token (a
        placeholder); else -1 (SampledRow.pending_row)."""
        return self.flight_row if self.num_pending > 0 else -1

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens


def unmark(reqs: list[Request]) -> list[Request]:
    """Clears what a launch set on its rows for its step alone (mark_drafts, mark_masks):
    the rows left marked, none."""
    for req in reqs:
        req.token_bitmask, req.draft_token_ids = None, ()
    return []


def mark_drafts(reqs: Sequence[Request], drafts: Mapping[str, Sequence[int]]) -> list[Request]:
    """Each drafted row's drafts for the step (SampledRow.draft_token_ids): the rows marked."""
    marked = [req for req in reqs if req.request_id in drafts]
    for req in marked:
        req.draft_token_ids = drafts[req.request_id]
    return marked


def mark_masks(
    rows: Sequence[Request], masks: Mapping[int, torch.Tensor], marked: list[Request]
) -> list[int]:
    """Row i's grammar mask for the step, masks[i] (SampledRow.token_bitmask), each row
    added to `marked`: the rows masked, by index."""
    for i, words in masks.items():
        rows[i].token_bitmask = words
        marked.append(rows[i])
    return list(masks)
