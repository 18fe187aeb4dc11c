"""The frontend's view of the other components: who is alive, and what a dead one took.

```
 inbox ── EngineStatus, ComponentStatus, TextOutputs ──▶ Liveness ──▶ /health, admission
       ── TokenizeAck ──────────────────────────────────▶ TokenizerHandoffs
 scheduler / detok connection closes (PeerWatch) ───────▶ on_disconnect ─┐
 watchdog, every WATCHDOG_S: windows lapsed, pids changed, lost handoffs ─┴▶ EngineClient
                                                          fail_component / fail_lost (503)
```

Liveness: a component is alive when it spoke within `window_s` = max(3 s, 3 × heartbeat_s):
  scheduler  EngineStatus ("ready" or "heartbeat"), or any TextOutputs (a step ran)
  detok      ComponentStatus("detok"), or any TextOutputs (only the detok sends them)
  tokenizer  ComponentStatus("tokenizer") from at least one worker pid
A "stopping" status marks the sender down at once (the scheduler's comes through the
detok, behind its last outputs), and so does the scheduler's or the detokenizer's
connection closing (the process died); for a short guard after that, only
a "ready" announcement (from its restarted successor) brings it back, not the dead
process's last messages still on their way. Times are the frontend's own monotonic
receipt times, so clock skew between hosts does not matter.

Handoffs: a request goes out on the PUSH pipe to the tokenizer pool, and ZeroMQ gives no
word of which worker takes it, so the workers say so (common.messages.TokenizeAck):

```
 submitted ──ack(pid)──▶ taken by pid ──ack(done)──▶ forgotten (the scheduler has it)
     │                        │
     └─ no ack in grace_s ────┴─ pid died ──▶ lost(): the frontend fails it with 503
```
Outputs, errors and aborts for a rid also forget it.

Liveness and TokenizerHandoffs are pure bookkeeping (callers pass `now`); HealthMonitor
owns the sockets and the watchdog task and runs on the event loop, except `peers_gone`,
which the inbox thread calls.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from typing import Any

import zmq

from common.log import get_logger
from common.messages import ComponentStatus, EngineStatus, Message, TokenizeAck
from common.zmq_queue import PeerWatch, PushQueue

log = get_logger("frontend.health")

COMPONENTS = ("scheduler", "tokenizer", "detok")
PRUNE_AFTER = 10  # forget a silent tokenizer pid after this many windows
DISCONNECT_GUARD_S = 1.0  # after a disconnect, only "ready" revives a component this long
ACK_GRACE_S = 0.5  # a live tokenizer takes a request off its pipe well within this
# a scheduler's connection closed: what it held fails this much later, so that its last
# outputs, still on their way through the detok, land first (a clean stop's "stopping"
# comes through the detok behind them and ends the wait at once)
DISCONNECT_SETTLE_S = 1.0
WATCHDOG_S = 0.2  # how often component liveness is checked for failures


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


class TokenizerHandoffs:
    def __init__(self) -> None:
        self.unacked: dict[str, float] = {}  # rid -> when it was sent, until a worker takes it
        self.taken: dict[str, int] = {}  # rid -> pid of the worker that took it
        self._lost_pids: set[int] = set()  # dead workers already accounted for

    def __bool__(self) -> bool:
        return bool(self.unacked or self.taken)

    def sent(self, rid: str, now: float) -> None:
        self.unacked[rid] = now

    def forget(self, rid: str) -> None:
        """rid is past the tokenizers (output, error or abort): nothing to watch."""
        self.unacked.pop(rid, None)
        self.taken.pop(rid, None)

    def on_ack(self, msg: TokenizeAck) -> None:
        for rid in msg.rids:
            if msg.done:
                self.taken.pop(rid, None)
            elif self.unacked.pop(rid, None) is not None:
                self.taken[rid] = msg.pid

    def newly_dead(self, dead: set[int]) -> set[int]:
        """Of the `dead` worker pids, those not reported before."""
        new = dead - self._lost_pids
        self._lost_pids |= new
        return new

    def prune(self, known: set[int]) -> None:
        """Forget dead pids liveness no longer tracks (`known`: the pids it does)."""
        self._lost_pids &= known

    def lost(
        self,
        now: float,
        dead: set[int] | frozenset[int] = frozenset(),
        grace_s: float = ACK_GRACE_S,
    ) -> list[str]:
        """Forget and return the rids a dead or hung worker holds: those no worker took
        within grace_s (in its pipe: a live worker takes its whole pipe at every loop) and
        those a `dead` worker took but never passed on."""
        rids = [rid for rid, t in self.unacked.items() if now - t > grace_s]
        rids += [rid for rid, pid in self.taken.items() if pid in dead]
        for rid in rids:
            self.forget(rid)
        return rids


class HealthMonitor:
    """The active part: the scheduler's and detok's connections watched, restarted pids
    noticed, and a watchdog, all reporting failures to the client: `fail_component(name,
    why)` for everything in flight, `fail_lost(rids, why)` for what a tokenizer held. The
    client feeds `liveness` and `handoffs` from the inbox and reads them directly."""

    def __init__(
        self,
        heartbeat_s: float,
        fail_component: Callable[[str, str], None],
        fail_lost: Callable[[list[str], str], None],
        send_scheduler: Callable[[Message], bool],
    ) -> None:
        self.heartbeat_s = heartbeat_s
        self.liveness = Liveness(heartbeat_s)
        self.handoffs = TokenizerHandoffs()  # which tokenizer worker holds which rid
        self._fail_component = fail_component
        self._fail_lost = fail_lost
        self._send_scheduler = send_scheduler
        self._alive = {name: False for name in COMPONENTS}
        self._settle_until: dict[str, float] = {}  # see DISCONNECT_SETTLE_S
        self._pids: dict[str, int] = {}  # scheduler / detok pid last heard
        self._detok_probe: PushQueue | None = None  # connected only to watch the detok
        self._watches: dict[str, PeerWatch] = {}  # read by the inbox thread only
        self._watchdog: asyncio.Task | None = None

    # -- lifecycle (on the event loop) ------------------------------------------------------
    def start(self, scheduler: zmq.Socket, detok_endpoint: str, ctx: zmq.Context) -> None:
        """Watch the connections of `scheduler` (the client's socket to it) and of a probe
        connected to the detok, and start the watchdog."""
        self._detok_probe = PushQueue(detok_endpoint, bind=False, ctx=ctx)
        self._watches = {
            "scheduler": PeerWatch(scheduler),
            "detok": PeerWatch(self._detok_probe.socket),
        }
        self._watchdog = asyncio.ensure_future(self._watch())

    def close(self) -> None:
        """After the inbox thread stopped (it reads the watches)."""
        if self._watchdog is not None:
            self._watchdog.cancel()
        for watch in self._watches.values():
            watch.close()
        if self._detok_probe is not None:
            self._detok_probe.close()

    async def wait_ready(self, timeout_s: float, stopped: Callable[[], bool]) -> None:
        """Return once every component is alive; TimeoutError after timeout_s,
        StartupStopped once `stopped()` (shutting down)."""
        deadline = time.monotonic() + timeout_s
        last_log = 0.0
        while missing := self.liveness.missing():
            if stopped():
                raise StartupStopped("stopped while waiting for components")
            now = time.monotonic()
            if now >= deadline:
                raise TimeoutError(f"components not ready after {timeout_s:.0f} s: {missing}")
            if now - last_log >= 5.0:
                log.info("waiting for %s", ", ".join(missing))
                last_log = now
            await asyncio.sleep(0.05)

    # -- the inbox thread -------------------------------------------------------------------
    def peers_gone(self) -> list[str]:
        """Which of scheduler / detok disconnected since the last call; never blocks."""
        return [name for name, watch in self._watches.items() if watch.gone()]

    # -- what the inbox heard (on the event loop) -------------------------------------------
    def on_component(self, msg: ComponentStatus, now: float) -> None:
        """A scheduler or detok with a new pid restarted: what the old one held is gone."""
        if msg.component in ("scheduler", "detok"):
            old = self._pids.get(msg.component)
            if msg.kind == "stopping" and old is not None and old != msg.pid:
                return  # a replaced process's last word, come late: not about its successor
            self._pids[msg.component] = msg.pid
            if old is not None and old != msg.pid:
                self._fail_component(msg.component, f"restarted (pid {old} -> {msg.pid})")
        self.liveness.on_component(msg, now)
        if (
            msg.kind == "stopping"
            and msg.component in ("scheduler", "detok")
            and self._alive[msg.component]
        ):
            # its outputs came before this: what is still open, it gave up (drain deadline)
            self._alive[msg.component] = False
            self._settle_until.pop(msg.component, None)
            self._fail_component(msg.component, "stopped")

    def on_disconnect(self, names: list[str]) -> None:
        """The scheduler's or detok's connection closed: the process is gone. /health says
        so now, without waiting for its heartbeats to lapse; what it held fails now (detok)
        or DISCONNECT_SETTLE_S later (scheduler: its last outputs may be in the detok)."""
        now = time.monotonic()
        for name in names:
            self.liveness.on_disconnect(name, now)
            if not self._alive[name]:
                continue
            if name == "scheduler":  # its last outputs may still be in the detok: see check
                self._settle_until[name] = now + DISCONNECT_SETTLE_S
            else:  # the detok delivers outputs itself: nothing more can come
                self._alive[name] = False
                self._fail_component(name, "disconnected")

    # -- the watchdog -----------------------------------------------------------------------
    async def _watch(self) -> None:
        """Fail what a dead component took with it, within one liveness window (~3 s)."""
        last_beat = 0.0
        while True:
            await asyncio.sleep(WATCHDOG_S)
            try:
                now = time.monotonic()
                if now - last_beat >= self.heartbeat_s:  # tells the scheduler our pid: a
                    last_beat = now  # new one means requests of a dead frontend are orphans
                    self._send_scheduler(
                        ComponentStatus("frontend", os.getpid(), "heartbeat", time.time())
                    )
                self.check(now)
            except Exception:  # the watchdog must outlive any surprise
                log.exception("component watchdog failed")

    def check(self, now: float) -> None:
        liveness, handoffs = self.liveness, self.handoffs
        dead = handoffs.newly_dead(liveness.dead_tokenizers(now))  # before missing(), which
        missing = liveness.missing(now)  # prunes long-silent tokenizers
        for name in ("scheduler", "detok"):
            alive = name not in missing
            settling = now < self._settle_until.get(name, 0.0)
            if self._alive[name] and not alive:
                if settling:
                    continue
                self._fail_component(
                    name, "disconnected" if name in self._settle_until else "stopped responding"
                )
            self._settle_until.pop(name, None)
            self._alive[name] = alive
        if dead:
            self._fail_lost(handoffs.lost(now, dead), f"tokenizer worker(s) {sorted(dead)} stopped")
        elif handoffs.unacked:  # a worker that hangs but keeps its socket still gets its
            # share of new requests: none may wait out the request timeout
            self._fail_lost(
                handoffs.lost(now, grace_s=liveness.window_s),
                "a tokenizer worker is not taking requests",
            )
        handoffs.prune(set(liveness.tokenizers))
