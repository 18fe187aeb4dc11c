"""tokenizer_worker → scheduler_worker (many PUSH → one PULL), and aborts from anyone.

AbortRequest is sent by the frontend (client disconnected) and by the detok worker (stop
string hit) straight to the scheduler's inbox. It may overtake its GenerateRequest, which
can still sit in a tokenizer worker: the scheduler must remember aborts of unknown rids.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from common.messages.base import Message
from common.sampling_params import SamplingParams


@dataclass(frozen=True, slots=True)
class GenerateRequest(Message):
    TAG: ClassVar[int] = 2
    rid: str
    prompt_token_ids: bytes  # pack_ids
    params: SamplingParams  # validated, max_tokens settled
    tokenized_time: float  # wall clock (the arrival time stays in the frontend)
    origin: int = 0  # TokenizeRequest.origin, passed through
    frontend: int = 0  # TokenizeRequest.frontend, passed through
    # TokenizeRequest.prediction tokenized (pack_ids), or None: drafts for speculative decoding
    prediction_token_ids: bytes | None = None


@dataclass(frozen=True, slots=True)
class AbortRequest(Message):
    TAG: ClassVar[int] = 3
    rid: str
    reason: str  # "client_disconnect" | "stop_string" | free text for logs
