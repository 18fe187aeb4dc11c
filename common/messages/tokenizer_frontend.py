"""tokenizer_worker → frontend inbox: where the requests a worker took off the pool are,
and the answers to TokenizerCalls.

Two acknowledgements per received batch: `done=False` before tokenizing (the worker took
these rids off its pipe), `done=True` after (each was forwarded to the scheduler or
failed back to the frontend). If a worker dies, the requests it held died with it: those
no worker acknowledged (still in its ZeroMQ pipe) and those it took but had not
finished. The frontend fails both (503) instead of letting them hang.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from common.messages.base import Message


@dataclass(frozen=True, slots=True)
class TokenizeAck(Message):
    TAG: ClassVar[int] = 9
    pid: int
    rids: list[str]
    done: bool = False  # False: taken off the pipe; True: forwarded (or failed back)


@dataclass(frozen=True, slots=True)
class TokenizerReply(Message):
    TAG: ClassVar[int] = 21
    call_id: str  # TokenizerCall.call_id
    status: int  # HTTP status: 200, or the error's (400 for bad input)
    body: dict[str, Any]  # the JSON answer; on an error {"message", "param"}
