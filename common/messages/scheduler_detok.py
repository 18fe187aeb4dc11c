"""scheduler_worker → detok_worker: ONE message per engine step covering every request.

The per-request fields are parallel lists indexed like `rids`. A request's detokenizer
settings travel once, in `new_requests`, in the first StepOutputs that mentions it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from common.messages.base import Message

# (rid, stop strings, skip_special_tokens, include_stop_str_in_output)
NewRequest = tuple[str, list[str], bool, bool]


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
