"""The frontend's cluster table (`Cluster`): which components are in it, which are alive,
what a dead one took with it, and which scheduler replica and tokenizer worker take the
next request. Pure bookkeeping; its rules (liveness, joins, model facts, tokenizer
hand-offs) are the room's, in frontend/cluster/__init__.py."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from common.auth import verify_replica
from common.endpoints import check_endpoint
from common.log import get_logger
from common.messages import ComponentStatus, EngineStatus
from common.model_facts import ModelFacts
from frontend.cluster.members import (
    Event,
    Failed,
    Joined,
    Member,
    StartupStopped,
    engine_facts,
    replica_key,
    replica_of,
)
from frontend.cluster.routing import ReplicaLoad, Router
from frontend.errors import APIError, unavailable

log = get_logger("frontend.cluster")

COMPONENTS = ("scheduler", "tokenizer", "detok")
GUARD_S = 1.0  # after a disconnect: only "ready" revives; a replica's requests fail after
PRUNE_AFTER = 10  # forget a silent tokenizer worker after this many windows
WATCHDOG_S = 0.2  # how often EngineClient runs check()


class Cluster:
    def __init__(
        self,
        heartbeat_s: float,
        model_name: str | None = None,  # a replica serving another is refused
        secret: str | None = None,  # a replica whose proof does not verify is refused
        routing: str = "least_loaded",
        data_parallel_size: int = 1,
    ) -> None:
        self.window_s = max(3.0, 3.0 * heartbeat_s)
        self.model_name = model_name
        self.secret = secret
        self.data_parallel_size = data_parallel_size
        self.router = Router(routing)
        self.members: dict[str, Member] = {"detok": Member()}
        self.engine: EngineStatus | None = None  # the latest of any replica, for /v1/models
        self.held: dict[str, int] = {}  # rid -> pid of the tokenizer worker it was sent to
        self.num_held: dict[int, int] = {}  # pid -> its rids in `held`
        self._num_picked = 0
        self._refused: set[tuple[str, int, str]] = set()  # (component, pid, why) logged

    # -- reading the table ------------------------------------------------------------------
    def engines(self) -> dict[int, EngineStatus]:
        """Each joined replica's latest status, by id."""
        return {
            replica_of(name): m.status
            for name, m in sorted(self.members.items())
            if m.status is not None
        }

    def facts(self) -> ModelFacts | None:
        """The model facts the replicas announced (they all agree: see _refusal); None
        before one joined."""
        for e in self.engines().values():
            return engine_facts(e)
        return None

    def alive(self, name: str, now: float) -> bool:
        m = self.members.get(name)
        return (
            m is not None
            and m.refused is None
            and m.last_seen is not None
            and now - m.last_seen <= self.window_s
        )

    def last_seen(self, name: str) -> float | None:
        m = self.members.get(name)
        return None if m is None else m.last_seen

    def alive_replicas(self, now: float) -> list[int]:
        return [k for k in sorted(self.engines()) if self.alive(f"scheduler.{k}", now)]

    def tokenizers(self) -> dict[str, Member]:
        return {n: m for n, m in self.members.items() if n.startswith("tokenizer.")}

    def missing(self, now: float | None = None) -> list[str]:
        now = time.monotonic() if now is None else now
        ok = {
            "scheduler": bool(self.alive_replicas(now)),
            "tokenizer": any(self.alive(n, now) for n in self.tokenizers()),
            "detok": self.alive("detok", now),
        }
        return [name for name in COMPONENTS if not ok[name]]

    async def wait_ready(self, timeout_s: float, stopped: Callable[[], bool]) -> None:
        """Return once every component is alive (one replica at least); TimeoutError
        after timeout_s, StartupStopped once `stopped()` (shutting down)."""
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

    # -- replica choice ---------------------------------------------------------------------
    def choose(self, pin: int | None, prefix_key: bytes | None, num_open: dict[int, int]) -> int:
        """The replica for a new request: `pin` (400 when no such replica can exist, 503
        when it is down), else the least loaded, with prefix affinity (routing.Router);
        `num_open`: the sub-requests the client routed to each and still waits on."""
        engines = self.engines()
        alive = self.alive_replicas(time.monotonic())
        if pin is not None:
            known = set(engines) | set(range(self.data_parallel_size))
            if pin < 0 or pin not in known:
                raise APIError(
                    400,
                    f"data_parallel_rank {pin} is out of range: the replicas are {sorted(known)}",
                    param="data_parallel_rank",
                )
            if pin not in alive:
                raise unavailable(f"scheduler replica {pin} is down", "replica_unavailable")
            return pin
        loads = [
            ReplicaLoad(
                k,
                engines[k].num_waiting,
                engines[k].num_running,
                engines[k].kv_usage,
                num_open.get(k, 0),
            )
            for k in alive
        ]
        if not loads:  # admission checked that one is alive; a race with its death
            raise unavailable("no scheduler replica is serving", "not_ready")
        return self.router.pick(loads, prefix_key)

    # -- what the inbox heard ---------------------------------------------------------------
    def _seen(self, name: str, now: float, ready: bool = False) -> None:
        m = self.members.setdefault(name, Member())
        if ready or now >= m.guard_until:
            m.last_seen = now

    def _down(self, name: str, why: str) -> list[Event]:
        """`name` is down for good: what it held fails, once."""
        m = self.members[name]
        was_up, m.up, m.disconnected = m.up, False, False
        return [Failed(name, why)] if was_up else []

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
        for k, other in self.engines().items():
            if k != msg.replica and (diff := engine_facts(other).differences(engine_facts(msg))):
                return f"its model facts differ from replica {k}'s: {diff}"
        old = self.members.get(f"scheduler.{msg.replica}")
        if (
            old is not None
            and old.status is not None
            and old.pid != msg.pid
            and old.status.inbox != msg.inbox
            and self.alive(f"scheduler.{msg.replica}", now)
        ):
            return f"replica {msg.replica} is already served by pid {old.pid} at {old.status.inbox}"
        return None

    def on_status(self, msg: EngineStatus | ComponentStatus, now: float) -> list[Event] | None:
        """A component's status: what to do about it; None when a replica is refused (the
        caller drops the message)."""
        if isinstance(msg, EngineStatus):
            return self._on_engine_status(msg, now)
        return self._on_component(msg, now)

    def _on_engine_status(self, msg: EngineStatus, now: float) -> list[Event] | None:
        if why := self._refusal(msg, now):
            if (f"scheduler.{msg.replica}", msg.pid, why) not in self._refused:  # one line each
                self._refused.add((f"scheduler.{msg.replica}", msg.pid, why))
                log.error(
                    "refused scheduler replica %d (pid %d, inbox %s): %s",
                    msg.replica,
                    msg.pid,
                    msg.inbox,
                    why,
                )
            return None
        key = f"scheduler.{msg.replica}"
        m = self.members.setdefault(key, Member())
        events: list[Event] = []
        if m.status is None or (m.pid, m.status.inbox) != (msg.pid, msg.inbox):
            if m.status is not None and m.pid != msg.pid:  # what the old process held is gone
                events += self._down(key, f"restarted (pid {m.pid} -> {msg.pid})")
            m.pid = msg.pid
            log.info(
                "scheduler replica %d joined: pid %d, inbox %s, %d KV blocks",
                msg.replica,
                msg.pid,
                msg.inbox,
                msg.num_total_blocks,
            )
            events.append(Joined(msg.replica, msg.inbox))
            m.status = msg
            self._vet_tokenizers()  # the facts they are held to may be new
        self.engine = m.status = msg
        if msg.kind in ("ready", "heartbeat"):
            self._seen(key, now, msg.kind == "ready")
        else:
            m.last_seen = None
        return events

    def _on_component(self, msg: ComponentStatus, now: float) -> list[Event]:
        stopping = msg.kind == "stopping"
        if msg.component == "tokenizer":
            name = f"tokenizer.{msg.pid}"
            if not stopping:
                worker = self.members.setdefault(name, Member(msg.pid, up=True))
                worker.last_seen = now
                facts = None if msg.facts is None else ModelFacts.from_wire(msg.facts)
                if facts != worker.facts:
                    worker.facts = facts
                    self._vet(name, worker, self.facts())
            elif name in self.members:  # marked silent (kept) so check() fails what it held
                self.members[name].last_seen = float("-inf")
            return []
        key = "detok" if msg.component == "detok" else replica_key(msg.component)
        if key is None:
            return []
        m = self.members.get(key)
        events: list[Event] = []
        if key != "detok":
            if m is None or m.status is None or m.pid != msg.pid:
                return []  # not (or no longer) the process in the table
        else:
            assert m is not None
            old = m.pid
            if stopping and old is not None and old != msg.pid:
                return []  # a replaced process's last word, come late: not its successor's
            m.pid = msg.pid
            if old is not None and old != msg.pid:  # whatever its predecessor held is gone
                events.append(Failed(key, f"restarted (pid {old} -> {msg.pid})"))
        if stopping:
            m.last_seen = None
            # its outputs came before this: what is still open, it gave up (drain deadline)
            events += self._down(key, "stopped")
        else:
            self._seen(key, now, msg.kind == "ready")
        return events

    def on_outputs(self, now: float, replica: int | None = None) -> None:
        """A TextOutputs came (from the detok, of `replica`'s step)."""
        self._seen("detok", now)
        key = f"scheduler.{replica}"
        if replica is not None and key in self.members and self.members[key].status is not None:
            self._seen(key, now)

    def on_disconnect(self, names: list[str], now: float) -> list[Event]:
        """A replica's or the detok's connection closed: the process is gone. /health says
        so now; what it held fails now (detok) or GUARD_S later (a replica: its last
        outputs may be in the detok)."""
        events: list[Event] = []
        for name in names:
            m = self.members.setdefault(name, Member())
            m.last_seen = None
            m.guard_until = now + GUARD_S
            if not m.up:
                continue
            if name == "detok":  # the detok delivers outputs itself: nothing more can come
                events += self._down(name, "disconnected")
            else:
                m.disconnected = True
        return events

    def _vet_tokenizers(self) -> None:
        facts = self.facts()
        for name, m in self.tokenizers().items():
            self._vet(name, m, facts)

    def _vet(self, name: str, m: Member, facts: ModelFacts | None) -> None:
        """Refuse tokenizer worker `name` while its facts differ from the replicas' (one
        log line per reason); a worker that stated none, or before any replica joined,
        is not refused."""
        diff = None if facts is None or m.facts is None else facts.differences(m.facts)
        m.refused = None if diff is None else f"its model facts differ from the replicas': {diff}"
        if m.refused is not None and (name, m.pid or 0, m.refused) not in self._refused:
            self._refused.add((name, m.pid or 0, m.refused))
            log.error("refused tokenizer worker (pid %s): %s", m.pid, m.refused)

    # -- tokenizer hand-offs ----------------------------------------------------------------
    def choose_tokenizer(self, now: float, skip: set[int] | None = None) -> int | None:
        """The pid of the tokenizer worker for the next request or call: the live one
        holding the fewest, then the least recently picked; None when none is live
        (but those in `skip`: their queues were full)."""
        best: tuple[tuple[int, int], Member] | None = None
        for name, m in self.members.items():
            if not name.startswith("tokenizer.") or not self.alive(name, now):
                continue
            assert m.pid is not None
            if skip and m.pid in skip:
                continue
            key = (self.num_held.get(m.pid, 0), m.picked)
            if best is None or key < best[0]:
                best = (key, m)
        if best is None:
            return None
        self._num_picked += 1
        best[1].picked = self._num_picked
        return best[1].pid

    def sent(self, rid: str, pid: int) -> None:
        """rid went to tokenizer worker `pid`: it holds it until forget(rid)."""
        self.held[rid] = pid
        self.num_held[pid] = self.num_held.get(pid, 0) + 1

    def forget(self, rid: str) -> None:
        """rid is past the tokenizers (output, error or abort): nothing to watch."""
        pid = self.held.pop(rid, None)
        if pid is not None:
            left = self.num_held[pid] - 1
            if left:
                self.num_held[pid] = left
            else:
                del self.num_held[pid]

    # -- the watchdog -----------------------------------------------------------------------
    def check(self, now: float) -> list[Event]:
        """Lapsed windows and ended guards: what to fail, each once."""
        events: list[Event] = []
        dead: set[int] = set()
        for name, m in list(self.members.items()):
            alive = self.alive(name, now)
            if name.startswith("tokenizer."):
                if m.up and not alive:
                    dead.add(int(name.partition(".")[2]))
                if not alive and now - (m.last_seen or 0.0) > PRUNE_AFTER * self.window_s:
                    del self.members[name]
                    continue
            elif m.up and not alive:
                if m.disconnected and now < m.guard_until:
                    continue  # its last outputs may still come through the detok
                events += self._down(
                    name, "disconnected" if m.disconnected else "stopped responding"
                )
            elif name != "detok" and m.status is None:
                continue  # not joined: nothing to report about
            m.up, m.disconnected = alive, False
        if dead:
            rids = [rid for rid, pid in self.held.items() if pid in dead]
            for rid in rids:
                self.forget(rid)
            events.append(Failed("tokenizer", f"tokenizer worker(s) {sorted(dead)} stopped", rids))
        return events
