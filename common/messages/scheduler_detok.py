"""scheduler_worker → detok_worker: ONE message per engine step covering every request.

The per-request fields are parallel lists indexed like `rids`: build the message with
`pack_step_outputs` from one StepOutput per request, read it with `unpack_step_outputs`
(which refuses lists of unequal lengths); both are `STEP_COLUMNS` (messages.columnar).
A request's detokenizer settings travel once, in `new_requests`, in the first StepOutputs
that mentions it.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from common.messages.base import Message
from common.messages.columnar import Columnar

# (rid, stop strings, skip_special_tokens, include_stop_str_in_output, the frontend that
# accepted it: its outputs go to that one's inbox, GenerateRequest.frontend)
NewRequest = tuple[str, list[str], bool, bool, int]


@dataclass(frozen=True, slots=True)
class StepOutputs(Message):
    TAG: ClassVar[int] = 4
    step: int
    rids: list[str]
    new_token_ids: list[bytes]  # pack_ids, per request; may be b"" (e.g. an abort)
    finish_reasons: list[str | None]  # "stop" | "length" | "abort" | None (still running)
    num_prompt_tokens: list[int]
    num_output_tokens: list[int]  # total so far, including this step's
    # None when no request in the step asked; else one entry per request: None, or one
    # entry per new token, e.g. [logprob, [[token_id, logprob], ...top-N]]
    logprobs: list[list | None] | None
    new_requests: list[NewRequest]
    # None when no request asked; else per request None or a dict of timestamps
    timings: list[dict[str, Any] | None] | None
    sent_time: float
    # None when no request finished on one of its stop_token_ids in this step; else per
    # request that token (the last of its new_token_ids) or None
    stop_token_ids: list[int | None] | None = None
    # None when no request in the step sends prompt logprobs (SamplingParams.prompt_logprobs,
    # with a request's first token); else per request None or one entry per prompt token:
    # [token_id, logprob (None for the first), [[token_id, logprob], ...top-N]]
    prompt_logprobs: list[list | None] | None = None
    # which replica stepped, and its inbox: a stop-string abort goes back there
    replica: int = 0
    inbox: str | None = None
    # the replica's cumulative prefix-cache [queries, hits] in tokens, as of this step
    prefix_cache: list[int] | None = None


@dataclass(slots=True)
class StepOutput:
    """One request's part of a StepOutputs (not a message itself)."""

    rid: str
    new_token_ids: bytes  # pack_ids
    finish_reason: str | None
    num_prompt_tokens: int
    num_output_tokens: int
    logprobs: list | None = None
    timings: dict[str, Any] | None = None
    stop_token_id: int | None = None
    prompt_logprobs: list | None = None


STEP_COLUMNS: Columnar[StepOutput] = Columnar(
    StepOutput,
    StepOutputs,
    rename={"rid": "rids", "finish_reason": "finish_reasons", "stop_token_id": "stop_token_ids"},
    optional=("logprobs", "timings", "stop_token_id", "prompt_logprobs"),
)


def pack_step_outputs(
    step: int,
    outputs: Sequence[StepOutput],
    new_requests: list[NewRequest],
    replica: int = 0,
    inbox: str | None = None,
    prefix_cache: list[int] | None = None,
) -> StepOutputs:
    return StepOutputs(
        step=step,
        new_requests=new_requests,
        sent_time=time.time(),
        replica=replica,
        inbox=inbox,
        prefix_cache=prefix_cache,
        **STEP_COLUMNS.pack(outputs),  # type: ignore[arg-type]
    )


def unpack_step_outputs(msg: StepOutputs) -> list[StepOutput]:
    """One StepOutput per rid; WireError if the per-request lists do not line up."""
    return STEP_COLUMNS.unpack(msg)
