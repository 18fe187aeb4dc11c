"""any component → frontend inbox: liveness, so /health can say which component is up."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from common.messages.base import Message


@dataclass(frozen=True, slots=True)
class ComponentStatus(Message):
    TAG: ClassVar[int] = 8
    component: str  # "tokenizer" | "scheduler" | "detok"
    pid: int
    kind: str  # "ready" | "heartbeat" | "stopping"
    time: float
