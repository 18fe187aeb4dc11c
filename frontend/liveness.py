"""Which components are up, judged by what the frontend inbox heard from them recently.

A component is alive when it spoke within `window_s` = max(3 s, 3 × heartbeat_s):
  scheduler  EngineStatus ("ready" or "heartbeat"), or any TextOutputs (a step ran)
  detok      ComponentStatus("detok"), or any TextOutputs (only the detok sends them)
  tokenizer  ComponentStatus("tokenizer") from at least one worker pid
A "stopping" status marks the sender down at once, and so does the scheduler's or the
detokenizer's connection closing (`on_disconnect`: the process died); for a short guard
after that, only a "ready" announcement (from its restarted successor) brings it back,
not the dead process's last messages still on their way. Times are the frontend's own
monotonic receipt times, so clock skew between hosts does not matter.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from common.log import get_logger
from common.messages import ComponentStatus, EngineStatus

log = get_logger("frontend.liveness")

COMPONENTS = ("scheduler", "tokenizer", "detok")
PRUNE_AFTER = 10  # forget a silent tokenizer pid after this many windows
DISCONNECT_GUARD_S = 1.0  # after a disconnect, only "ready" revives a component this long


class StartupStopped(RuntimeError):
    """wait_ready gave up because the process is shutting down."""


class Liveness:
    def __init__(self, heartbeat_s: float) -> None:
        self.window_s = max(3.0, 3.0 * heartbeat_s)
        self.last_seen: dict[str, float] = {}  # "scheduler" / "detok" -> monotonic time
        self.tokenizers: dict[int, float] = {}  # pid -> monotonic time
        self.engine: EngineStatus | None = None  # the latest, for /v1/models and /metrics
        self.guard_until: dict[str, float] = {}  # see on_disconnect

    def _seen(self, name: str, now: float, ready: bool = False) -> None:
        if ready or now >= self.guard_until.get(name, 0.0):
            self.last_seen[name] = now

    def on_disconnect(self, name: str, now: float) -> None:
        """The scheduler's or detok's socket connection closed: it is gone."""
        self.last_seen.pop(name, None)
        self.guard_until[name] = now + DISCONNECT_GUARD_S

    def on_engine_status(self, msg: EngineStatus, now: float) -> None:
        self.engine = msg
        if msg.kind in ("ready", "heartbeat"):
            self._seen("scheduler", now, msg.kind == "ready")
        else:
            self.last_seen.pop("scheduler", None)

    def on_component(self, msg: ComponentStatus, now: float) -> None:
        stopping = msg.kind == "stopping"
        if msg.component == "tokenizer":
            if stopping:  # marked silent (not dropped) so the frontend fails what it held
                if msg.pid in self.tokenizers:
                    self.tokenizers[msg.pid] = float("-inf")
            else:
                self.tokenizers[msg.pid] = now
        elif msg.component in ("scheduler", "detok"):
            if stopping:
                self.last_seen.pop(msg.component, None)
            # a scheduler counts as ready only once its EngineStatus arrived
            elif msg.component == "detok" or self.engine is not None:
                self._seen(msg.component, now, msg.kind == "ready")

    def on_outputs(self, now: float) -> None:
        self._seen("detok", now)
        if self.engine is not None:
            self._seen("scheduler", now)

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
        out = []
        for name in COMPONENTS:
            if name == "tokenizer":
                ok = self._alive_tokenizers(now) > 0
            else:
                seen = self.last_seen.get(name)
                ok = seen is not None and now - seen <= self.window_s
            if not ok:
                out.append(name)
        return out

    def report(self, now: float | None = None) -> dict[str, Any]:
        now = time.monotonic() if now is None else now
        missing = self.missing(now)
        out: dict[str, Any] = {}
        for name in COMPONENTS:
            if name == "tokenizer":
                seen = max(self.tokenizers.values(), default=None)
            else:
                seen = self.last_seen.get(name)
            entry: dict[str, Any] = {
                "alive": name not in missing,
                "last_seen_s": None if seen is None else round(now - seen, 3),
            }
            if name == "tokenizer":
                entry["workers"] = self._alive_tokenizers(now)
            out[name] = entry
        return out

    async def wait_ready(self, timeout_s: float, stopped: Callable[[], bool]) -> None:
        """Return once every component is alive; TimeoutError after timeout_s,
        StartupStopped once `stopped()` (shutting down)."""
        deadline = time.monotonic() + timeout_s
        last_log = 0.0
        while missing := self.missing():
            if stopped():
                raise StartupStopped("stopped while waiting for components")
            now = time.monotonic()
            if now >= deadline:
                raise TimeoutError(f"components not ready after {timeout_s:.0f} s: {missing}")
            if now - last_log >= 5.0:
                log.info("waiting for %s", ", ".join(missing))
                last_log = now
            await asyncio.sleep(0.05)
