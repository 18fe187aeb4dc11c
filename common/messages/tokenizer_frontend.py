"""tokenizer_worker → frontend inbox: which requests a worker has taken off the pool queue.

Sent once per received batch, before tokenizing. A request the frontend submitted that no
worker acknowledged was still in a ZeroMQ pipe; if a worker dies, such requests died with
it, and the frontend fails them (503) instead of letting them hang.
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
