"""any component → frontend inbox: liveness, so /health can say which component is up;
a tokenizer worker's also states its model facts (common.model_facts.ModelFacts.to_wire),
which the frontend checks against the scheduler replicas' (frontend.cluster)."""

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
    facts: tuple[str, int, int, int] | None = None  # a tokenizer's: model, vocab, context, 0
