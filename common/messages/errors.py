"""any worker → frontend inbox: a request failed (validation, too long, engine error)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from common.messages.base import Message


@dataclass(frozen=True, slots=True)
class RequestError(Message):
    TAG: ClassVar[int] = 7
    rid: str
    status: int  # HTTP status for the client, e.g. 400
    message: str
    type: str  # OpenAI error type, e.g. "invalid_request_error"
    param: str | None  # the offending parameter, if any
