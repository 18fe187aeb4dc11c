"""tokenizer_worker → frontend inbox: the answers to TokenizerCalls. (No word about
requests: the frontend picks the worker for each, so it knows who holds what; wire tag 9,
the acknowledgements that told it before, is retired.)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from common.messages.base import Message


@dataclass(frozen=True, slots=True)
class TokenizerReply(Message):
    TAG: ClassVar[int] = 21
    call_id: str  # TokenizerCall.call_id
    status: int  # HTTP status: 200, or the error's (400 for bad input)
    body: dict[str, Any]  # the JSON answer; on an error {"message", "param"}
