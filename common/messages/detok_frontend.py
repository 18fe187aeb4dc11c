"""detok_worker → frontend inbox: ONE message per engine step with every request's text delta.

Parallel lists indexed like `rids`: build the message with `pack_text_outputs` from one
TextOutput per request, read it with `unpack_text_outputs` (which refuses lists of
unequal lengths); both are `TEXT_COLUMNS` (messages.columnar). `texts[i]` is the new
text safe to stream now (stop strings already cut); a request is done when
`finish_reasons[i]` is not None.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, ClassVar, Protocol, TypeVar

from common.messages.base import Message
from common.messages.columnar import Columnar


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
    # None when no request in the message has them; else per request None or, per prompt
    # token, [logprob (None for the first), [[token_id, logprob], ...], [token str, top
    # strs...]] (StepOutputs.prompt_logprobs, named by the detok)
    prompt_logprobs: list[list | None] | None = None
    replica: int = 0  # the scheduler replica that stepped (StepOutputs.replica)
    prefix_cache: list[int] | None = None  # StepOutputs.prefix_cache


@dataclass(slots=True)
class TextOutput:
    """One request's part of a TextOutputs (not a message itself)."""

    rid: str
    text: str
    finish_reason: str | None
    num_prompt_tokens: int
    num_output_tokens: int
    token_ids: bytes  # pack_ids
    logprobs: list | None = None
    timings: dict[str, Any] | None = None
    stop_reason: str | int | None = None
    prompt_logprobs: list | None = None


class _Output(Protocol):
    prompt_logprobs: list | None


OutputT = TypeVar("OutputT", bound=_Output)


def join_outputs(a: OutputT, b: OutputT, concat: Sequence[str]) -> OutputT:
    """Two consecutive outputs of one request, a then b, as one (the detok's TextOutput,
    the frontend's Delta): b's fields, but those named in `concat` joined, a's + b's (one
    of them None: the other), and the prompt's logprobs (a first output's) a's."""
    joined = {name: _join(getattr(a, name), getattr(b, name)) for name in concat}
    if a.prompt_logprobs is not None:
        joined["prompt_logprobs"] = a.prompt_logprobs
    return replace(b, **joined)  # type: ignore[type-var]  # both kinds are dataclasses


def _join(x: Any, y: Any) -> Any:
    return y if x is None else x if y is None else x + y


TEXT_COLUMNS: Columnar[TextOutput] = Columnar(
    TextOutput,
    TextOutputs,
    rename={
        "rid": "rids",
        "text": "texts",
        "finish_reason": "finish_reasons",
        "stop_reason": "stop_reasons",
    },
    optional=("logprobs", "timings", "prompt_logprobs"),
)


def pack_text_outputs(
    outputs: Sequence[TextOutput], replica: int = 0, prefix_cache: list[int] | None = None
) -> TextOutputs:
    return TextOutputs(
        sent_time=time.time(),
        replica=replica,
        prefix_cache=prefix_cache,
        **TEXT_COLUMNS.pack(outputs),  # type: ignore[arg-type]
    )


def unpack_text_outputs(msg: TextOutputs) -> list[TextOutput]:
    """One TextOutput per rid; WireError if the per-request lists do not line up."""
    return TEXT_COLUMNS.unpack(msg)
