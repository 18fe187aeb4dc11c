"""The cluster table's rows and events: a component's `Member` row, the `Joined` / `Failed`
events the table returns for EngineClient to act on, and the names of scheduler replicas
("scheduler.K")."""

from __future__ import annotations

from dataclasses import dataclass

from common.messages import EngineStatus
from common.model_facts import ModelFacts


@dataclass(frozen=True, slots=True)
class Joined:
    replica: int
    inbox: str | None  # None: the config's address (IPCConfig.replica_endpoint)


@dataclass(frozen=True, slots=True)
class Failed:
    component: str  # "detok", "scheduler.K", "tokenizer"
    why: str
    rids: list[str] | None = None  # a tokenizer's: the requests it held; else all it held


Event = Joined | Failed


@dataclass(slots=True)
class Member:
    pid: int | None = None
    last_seen: float | None = None  # monotonic receipt time; None: down
    guard_until: float = 0.0  # see GUARD_S
    disconnected: bool = False  # its connection closed while it was up: failing waits
    up: bool = False  # as last acted on: a failure is reported when this turns False
    status: EngineStatus | None = None  # a replica's latest
    picked: int = 0  # a tokenizer's: when it was last picked (a count of picks)
    facts: ModelFacts | None = None  # a tokenizer's, as it announced them
    refused: str | None = None  # a tokenizer's: why its facts are not the replicas'


class StartupStopped(RuntimeError):
    """wait_ready gave up because the process is shutting down."""


def replica_key(component: str) -> str | None:
    """ "scheduler.K" for a scheduler replica's component name, else None."""
    if component == "scheduler":
        return "scheduler.0"
    head, _, num = component.partition(".")
    return component if head == "scheduler" and num.isdigit() else None


def replica_of(key: str) -> int:
    return int(key.partition(".")[2])


def engine_facts(msg: EngineStatus) -> ModelFacts:
    return ModelFacts(msg.model, msg.vocab_size, msg.max_model_len, msg.block_size)
