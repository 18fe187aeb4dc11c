"""detok_worker → frontend inbox: ONE message per engine step with every request's text delta.

Parallel lists indexed like `rids`. `texts[i]` is the new text safe to stream now (stop
strings already cut); a request is done when `finish_reasons[i]` is not None.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from common.messages.base import Message


@dataclass(frozen=True, slots=True)
class TextOutputs(Message):
    TAG: ClassVar[int] = 6
    rids: list[str]
    texts: list[str]
    finish_reasons: list[str | None]  # "stop" | "length" | "abort" | None
    num_prompt_tokens: list[int]
    num_output_tokens: list[int]
    token_ids: list[bytes]  # pack_ids: this step's new ids per request
    logprobs: list[list | None] | None  # as in StepOutputs
    timings: list[dict[str, Any] | None] | None  # as in StepOutputs, detok times added
    # what stopped it (vLLM's stop_reason): the matched stop string, the stop_token_ids
    # entry, or None (EOS, length, abort)
    stop_reasons: list[str | int | None]
    sent_time: float
