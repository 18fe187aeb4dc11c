"""The frontend's view of the other components: who is alive, and what a dead one took.

```
 inbox ── EngineStatus ──▶ HealthMonitor.on_engine_status: the replica table (join / refuse)
       ── ComponentStatus, TextOutputs ──▶ Liveness ──▶ /health, admission, routing
       ── TokenizeAck ──────────────────▶ TokenizerHandoffs (frontend.handoffs)
 a replica's / the detok's connection closes (PeerWatch) ──▶ on_disconnect ─┐
 watchdog, every WATCHDOG_S: windows lapsed, pids changed, lost handoffs ────┴▶ EngineClient
                                                          fail_component / fail_lost (503)
```

Components by name (frontend.liveness): "detok", "tokenizer", and "scheduler.K" per
scheduler replica K; "scheduler" as a whole is up while at least one replica is.

Liveness: a component is alive when it spoke within `window_s` = max(3 s, 3 × heartbeat_s):
  scheduler.K  its EngineStatus ("ready" or "heartbeat"), or a TextOutputs of its step
  detok        ComponentStatus("detok"), or any TextOutputs (only the detok sends them)
  tokenizer    ComponentStatus("tokenizer") from at least one worker pid
A "stopping" status marks the sender down at once (a replica's comes through the detok,
behind its last outputs), and so does a replica's or the detokenizer's connection closing
(the process died); for a short guard after that, only a "ready" announcement (from its
restarted successor) brings it back, not the dead process's last messages still on their
way. Times are the frontend's own monotonic receipt times, so clock skew between hosts
does not matter.

The replica table: a replica joins with its EngineStatus (id, pid, inbox, model facts,
KV pool; `proof` that it holds ipc.secret). Refused, with one log line each: another
model (or other model facts than the replicas already in), a wrong secret, and a second
process claiming a live replica's id at another inbox. The same id at the same inbox
with a new pid is that replica restarted: what the old process held fails.

Liveness is pure bookkeeping (callers pass `now`); HealthMonitor owns the watches and the
watchdog task and runs on the event loop, except `peers_gone`, which the inbox thread
calls.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable

import zmq

from common.auth import verify_replica
from common.endpoints import check_endpoint
from common.log import get_logger
from common.messages import ComponentStatus, EngineStatus, Message
from common.zmq_queue import PeerWatch, PushQueue
from frontend.handoffs import ACK_GRACE_S, TokenizerHandoffs
from frontend.liveness import Liveness, replica_key, replica_of

__all__ = [
    "ACK_GRACE_S",
    "HealthMonitor",
    "Liveness",
    "TokenizerHandoffs",
    "replica_key",
    "replica_of",
]

log = get_logger("frontend.health")

# a replica's connection closed: what it held fails this much later, so that its last
# outputs, still on their way through the detok, land first (a clean stop's "stopping"
# comes through the detok behind them and ends the wait at once)
DISCONNECT_SETTLE_S = 1.0
WATCHDOG_S = 0.2  # how often component liveness is checked for failures


class StartupStopped(RuntimeError):
    """wait_ready gave up because the process is shutting down."""


class HealthMonitor:
    """The active part: the replica table kept, the replicas' and detok's connections
    watched, restarted pids noticed, and a watchdog, all reporting failures to the
    client: `fail_component(name, why)` for what a replica ("scheduler.K") or the detok
    held, `fail_lost(rids, why)` for what a tokenizer held; `on_join(replica, inbox)`
    when a replica joins or rejoins. The client feeds `liveness` and `handoffs` from the
    inbox and reads them directly."""

    def __init__(
        self,
        heartbeat_s: float,
        fail_component: Callable[[str, str], None],
        fail_lost: Callable[[list[str], str], None],
        send_scheduler: Callable[[Message], bool],
        model_name: str | None = None,  # a replica serving another is refused
        secret: str | None = None,  # a replica whose proof does not verify is refused
        on_join: Callable[[int, str | None], None] | None = None,
    ) -> None:
        self.heartbeat_s = heartbeat_s
        self.liveness = Liveness(heartbeat_s)
        self.handoffs = TokenizerHandoffs()  # which tokenizer worker holds which rid
        self.model_name = model_name
        self.secret = secret
        self._fail_component = fail_component
        self._fail_lost = fail_lost
        self._send_scheduler = send_scheduler
        self._on_join = on_join
        self._alive: dict[str, bool] = {"detok": False}  # and "scheduler.K" once joined
        self._settle_until: dict[str, float] = {}  # see DISCONNECT_SETTLE_S
        self._pids: dict[str, int] = {}  # detok / replica pid last heard
        self._refused: set[tuple[int, int, str]] = set()  # (replica, pid, why) logged
        self._detok_probe: PushQueue | None = None  # connected only to watch the detok
        self._watches: dict[str, PeerWatch] = {}  # read by the inbox thread only
        self._old_watches: list[PeerWatch] = []
        self._watchdog: asyncio.Task | None = None

    # -- lifecycle (on the event loop) ------------------------------------------------------
    def start(self, detok_endpoint: str, ctx: zmq.Context) -> None:
        """Watch a probe connected to the detok, and start the watchdog."""
        self._detok_probe = PushQueue(detok_endpoint, bind=False, ctx=ctx)
        self._watches = {"detok": PeerWatch(self._detok_probe.socket)}
        self._watchdog = asyncio.ensure_future(self._watch())

    def watch_replica(self, replica: int, socket: zmq.Socket) -> None:
        """Watch the client's socket to a replica's inbox. The inbox thread reads the
        watches: the table is replaced, never changed in place."""
        key = f"scheduler.{replica}"
        old = self._watches.get(key)
        if old is not None:
            self._old_watches.append(old)  # closed at the end: the inbox thread may read it
        self._watches = {**self._watches, key: PeerWatch(socket)}

    def close(self) -> None:
        """After the inbox thread stopped (it reads the watches)."""
        if self._watchdog is not None:
            self._watchdog.cancel()
        for watch in [*self._watches.values(), *self._old_watches]:
            watch.close()
        if self._detok_probe is not None:
            self._detok_probe.close()

    async def wait_ready(self, timeout_s: float, stopped: Callable[[], bool]) -> None:
        """Return once every component is alive (one replica at least); TimeoutError
        after timeout_s, StartupStopped once `stopped()` (shutting down)."""
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
        """Which replicas / the detok disconnected since the last call; never blocks."""
        return [name for name, watch in self._watches.items() if watch.gone()]

    # -- what the inbox heard (on the event loop) -------------------------------------------
    def _refusal(self, msg: EngineStatus, now: float) -> str | None:
        if self.model_name is not None and msg.model != self.model_name:
            return f"it serves model {msg.model!r}, this frontend {self.model_name!r}"
        if not verify_replica(self.secret, msg.replica, msg.pid, msg.proof):
            return "it does not hold this frontend's secret (ipc.secret)"
        try:
            if msg.inbox is not None:
                check_endpoint(msg.inbox)
        except ValueError as bad:
            return str(bad)
        for k, other in self.liveness.engines.items():
            theirs = (other.vocab_size, other.max_model_len)
            if k != msg.replica and theirs != (msg.vocab_size, msg.max_model_len):
                return (
                    f"its model facts (vocab {msg.vocab_size}, context {msg.max_model_len}) "
                    f"differ from replica {k}'s {theirs}"
                )
        old = self.liveness.engines.get(msg.replica)
        if (
            old is not None
            and old.pid != msg.pid
            and old.inbox != msg.inbox
            and self.liveness.alive(f"scheduler.{msg.replica}", now)
        ):
            return f"replica {msg.replica} is already served by pid {old.pid} at {old.inbox}"
        return None

    def on_engine_status(self, msg: EngineStatus, now: float) -> bool:
        """A replica's status: it joins (or rejoins, restarted), is refused, or reports
        its load. False when refused (the caller drops the message)."""
        if why := self._refusal(msg, now):
            if (msg.replica, msg.pid, why) not in self._refused:  # one line per refusal
                self._refused.add((msg.replica, msg.pid, why))
                log.error(
                    "refused scheduler replica %d (pid %d, inbox %s): %s",
                    msg.replica,
                    msg.pid,
                    msg.inbox,
                    why,
                )
            return False
        key = f"scheduler.{msg.replica}"
        old = self.liveness.engines.get(msg.replica)
        if old is None or (old.pid, old.inbox) != (msg.pid, msg.inbox):
            if old is not None and old.pid != msg.pid and self._alive.get(key):
                self._alive[key] = False  # what the old process held is gone with it
                self._settle_until.pop(key, None)
                self._fail_component(key, f"restarted (pid {old.pid} -> {msg.pid})")
            self._pids[key] = msg.pid
            log.info(
                "scheduler replica %d joined: pid %d, inbox %s, %d KV blocks",
                msg.replica,
                msg.pid,
                msg.inbox,
                msg.num_total_blocks,
            )
            if self._on_join is not None:
                self._on_join(msg.replica, msg.inbox)
        self._alive.setdefault(key, False)
        self.liveness.on_engine_status(msg, now)
        return True

    def on_component(self, msg: ComponentStatus, now: float) -> None:
        """A detok with a new pid restarted: what the old one held is gone. A replica's
        statuses count only from the pid that joined (its EngineStatus says which)."""
        key = "detok" if msg.component == "detok" else replica_key(msg.component)
        if key is not None and key != "detok":
            if self._pids.get(key) != msg.pid:
                return  # not (or no longer) the process in the table
        elif key == "detok":
            old = self._pids.get(key)
            if msg.kind == "stopping" and old is not None and old != msg.pid:
                return  # a replaced process's last word, come late: not about its successor
            self._pids[key] = msg.pid
            if old is not None and old != msg.pid:
                self._fail_component(key, f"restarted (pid {old} -> {msg.pid})")
        self.liveness.on_component(msg, now)
        if key is not None and msg.kind == "stopping" and self._alive.get(key):
            # its outputs came before this: what is still open, it gave up (drain deadline)
            self._alive[key] = False
            self._settle_until.pop(key, None)
            self._fail_component(key, "stopped")

    def on_disconnect(self, names: list[str]) -> None:
        """A replica's or the detok's connection closed: the process is gone. /health
        says so now, without waiting for its heartbeats to lapse; what it held fails now
        (detok) or DISCONNECT_SETTLE_S later (a replica: its last outputs may be in the
        detok)."""
        now = time.monotonic()
        for name in names:
            self.liveness.on_disconnect(name, now)
            if not self._alive.get(name):
                continue
            if name != "detok":  # its last outputs may still be in the detok: see check
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
                if now - last_beat >= self.heartbeat_s:  # tells the replicas our pid: a
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
        liveness.missing(now)  # prunes long-silent tokenizers
        for name in list(self._alive):
            alive = liveness.alive(name, now)
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
