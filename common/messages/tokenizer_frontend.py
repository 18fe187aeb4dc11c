"""tokenizer_worker → frontend inbox: where the requests a worker took off the pool are.

Two acknowledgements per received batch: `done=False` before tokenizing (the worker took
these rids off its pipe), `done=True` after (each was forwarded to the scheduler or
failed back to the frontend). If a worker dies, the requests it held died with it: those
no worker acknowledged (still in its ZeroMQ pipe) and those it took but had not
finished. The frontend fails both (503) instead of letting them hang.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from common.messages.base import Message


@dataclass(frozen=True, slots=True)
class TokenizeAck(Message):
    TAG: ClassVar[int] = 9
    pid: int
    rids: list[str]
    done: bool = False  # False: taken off the pipe; True: forwarded (or failed back)
