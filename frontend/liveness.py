"""Which components are alive, from what the frontend inbox hears (pure bookkeeping:
callers pass `now`, the frontend's own monotonic receipt time, so clock skew between hosts
does not matter). frontend.health explains the rules and acts on them.

Components by name: "detok", "tokenizer" (a pool of pids), and one "scheduler.K" per
scheduler replica K ("scheduler", from an older sender, is replica 0). "scheduler" as a
whole is up while at least one replica is.
"""

from __future__ import annotations

import time
from typing import Any

from common.messages import ComponentStatus, EngineStatus

COMPONENTS = ("scheduler", "tokenizer", "detok")
PRUNE_AFTER = 10  # forget a silent tokenizer pid after this many windows
DISCONNECT_GUARD_S = 1.0  # after a disconnect, only "ready" revives a component this long


def replica_key(component: str) -> str | None:
    """ "scheduler.K" for a scheduler replica's component name, else None."""
    if component == "scheduler":
        return "scheduler.0"
    head, _, num = component.partition(".")
    return component if head == "scheduler" and num.isdigit() else None


def replica_of(key: str) -> int:
    return int(key.partition(".")[2])


class Liveness:
    def __init__(self, heartbeat_s: float) -> None:
        self.window_s = max(3.0, 3.0 * heartbeat_s)
        self.last_seen: dict[str, float] = {}  # "scheduler.K" / "detok" -> monotonic time
        self.tokenizers: dict[int, float] = {}  # pid -> monotonic time
        self.engines: dict[int, EngineStatus] = {}  # each admitted replica's latest status
        self.engine: EngineStatus | None = None  # the latest of any, for /v1/models
        self.guard_until: dict[str, float] = {}  # see on_disconnect

    def _seen(self, name: str, now: float, ready: bool = False) -> None:
        if ready or now >= self.guard_until.get(name, 0.0):
            self.last_seen[name] = now

    def on_disconnect(self, name: str, now: float) -> None:
        """A replica's or the detok's socket connection closed: it is gone."""
        self.last_seen.pop(name, None)
        self.guard_until[name] = now + DISCONNECT_GUARD_S

    def on_engine_status(self, msg: EngineStatus, now: float) -> None:
        """An admitted replica's status (HealthMonitor.on_engine_status admits)."""
        self.engine = self.engines[msg.replica] = msg
        key = f"scheduler.{msg.replica}"
        if msg.kind in ("ready", "heartbeat"):
            self._seen(key, now, msg.kind == "ready")
        else:
            self.last_seen.pop(key, None)

    def on_component(self, msg: ComponentStatus, now: float) -> None:
        stopping = msg.kind == "stopping"
        if msg.component == "tokenizer":
            if stopping:  # marked silent (not dropped) so the frontend fails what it held
                if msg.pid in self.tokenizers:
                    self.tokenizers[msg.pid] = float("-inf")
            else:
                self.tokenizers[msg.pid] = now
            return
        key = "detok" if msg.component == "detok" else replica_key(msg.component)
        if key is None:
            return
        if stopping:
            self.last_seen.pop(key, None)
        # a replica counts as ready only once its EngineStatus arrived
        elif key == "detok" or replica_of(key) in self.engines:
            self._seen(key, now, msg.kind == "ready")

    def on_outputs(self, now: float, replica: int | None = None) -> None:
        self._seen("detok", now)
        if replica is not None and replica in self.engines:
            self._seen(f"scheduler.{replica}", now)

    def alive(self, name: str, now: float) -> bool:
        seen = self.last_seen.get(name)
        return seen is not None and now - seen <= self.window_s

    def alive_replicas(self, now: float) -> list[int]:
        return [k for k in sorted(self.engines) if self.alive(f"scheduler.{k}", now)]

    def dead_tokenizers(self, now: float) -> set[int]:
        """Pids of tokenizer workers silent for longer than the window (not yet forgotten)."""
        return {pid for pid, t in self.tokenizers.items() if now - t > self.window_s}

    def _alive_tokenizers(self, now: float) -> int:
        stale = [pid for pid, t in self.tokenizers.items() if now - t > PRUNE_AFTER * self.window_s]
        for pid in stale:
            del self.tokenizers[pid]
        return sum(1 for t in self.tokenizers.values() if now - t <= self.window_s)

    def missing(self, now: float | None = None) -> list[str]:
        now = time.monotonic() if now is None else now
        ok = {
            "scheduler": bool(self.alive_replicas(now)),
            "tokenizer": self._alive_tokenizers(now) > 0,
            "detok": self.alive("detok", now),
        }
        return [name for name in COMPONENTS if not ok[name]]

    def report(self, now: float | None = None) -> dict[str, Any]:
        now = time.monotonic() if now is None else now
        missing = self.missing(now)

        def age(seen: float | None) -> float | None:
            return None if seen is None else round(now - seen, 3)

        replicas = {}
        for k, e in sorted(self.engines.items()):
            replicas[str(k)] = {
                "alive": self.alive(f"scheduler.{k}", now),
                "last_seen_s": age(self.last_seen.get(f"scheduler.{k}")),
                "pid": e.pid,
                "inbox": e.inbox,
                "num_requests_running": e.num_running,
                "num_requests_waiting": e.num_waiting,
                "kv_cache_usage": round(e.kv_usage, 4),
            }
        seen = [t for name, t in self.last_seen.items() if name.startswith("scheduler.")]
        return {
            "scheduler": {
                "alive": "scheduler" not in missing,
                "last_seen_s": age(max(seen, default=None)),
                "replicas": replicas,
            },
            "tokenizer": {
                "alive": "tokenizer" not in missing,
                "last_seen_s": age(max(self.tokenizers.values(), default=None)),
                "workers": self._alive_tokenizers(now),
            },
            "detok": {
                "alive": "detok" not in missing,
                "last_seen_s": age(self.last_seen.get("detok")),
            },
        }
