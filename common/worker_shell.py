"""The shell every worker process shares; each worker adds only its own handling.

    WorkerShell
      inbox          the worker's receiving queue (its kind and endpoint are the worker's)
      to_frontend    FrontendLinks: one PUSH per frontend inbox (config.api_servers);
                     a request's errors and outputs go to the frontend that accepted it
                     (its `frontend` id), status beats to every one
      replicas       ReplicaSockets: one PUSH per scheduler-replica inbox, made when first named
      drain          Drain: SIGTERM -> keep working until quiet (or busy is over) or the deadline
      beats          "ready" at start, "heartbeat" every heartbeat_s, "stopping" at the end,
                     sent by the worker's own `status(kind)` (its message, its fields)
      run(handle)    the inbox loop: block for a batch, handle each message, beat, drain, close

Liveness beats come from a Heartbeat thread (common.heartbeat) or from the loop: a worker
whose step can be long (the detok under a big batch, the engine in a prefill) takes the
thread, so busy is not mistaken for dead; the tokenizer beats from its loop, so a worker
hung inside a request falls silent.

The scheduler does not use `run`: its loop is event-driven and latency-critical (drain
the inbox without waiting while requests run, one engine step, one output message; block
only when idle, docs/architecture.md), so it keeps its own loop and takes from here only
the start/finish beats, the heartbeat thread, `drain` (checked as `drain.running or
drain.draining(busy)`, one attribute read per step while serving) and the socket closing.
"""

from __future__ import annotations

import gc
import signal
import time
from collections.abc import Callable
from typing import Any, TypeVar

import zmq

from common import collector
from common.config import Config
from common.frontend_links import FrontendLinks
from common.heartbeat import Heartbeat
from common.log import get_logger
from common.messages import Message
from common.zmq_queue import PullQueue, PushQueue

log = get_logger("worker")

DRAIN_POLL_MS = 100  # after SIGTERM the inbox is polled this often, to notice the deadline

Q = TypeVar("Q", PushQueue, PullQueue)


class Drain:
    """Stop semantics shared by the workers. The first stop() ends *running*; the worker
    then goes on while it is busy (requests in flight) or while messages still arrive
    (no `quiet_s` has passed since the last one, or since the signal), never past
    `timeout_s` after the signal. A second stop() ends the drain at once.

    The frontend is the gate that refuses new work while it drains; supervisord signals
    every program at the same moment, so what the frontend accepted just before may still
    be on its way through this worker's pipe after the signal: the quiet period lets it in."""

    def __init__(self, timeout_s: float, quiet_s: float) -> None:
        self.timeout_s = timeout_s
        self.quiet_s = quiet_s
        self.running = True
        self.deadline = 0.0
        self.last_activity = 0.0  # monotonic: the last message (or the signal, if later)

    def touch(self) -> None:
        """A message arrived (or was handled): the quiet period starts again."""
        self.last_activity = time.monotonic()

    def stop(self, *_args: Any) -> bool:
        """Begin draining (True), or, when already draining, stop now (False)."""
        if not self.running:
            self.deadline = 0.0
            return False
        self.running = False
        now = time.monotonic()
        self.deadline = now + self.timeout_s
        self.last_activity = max(self.last_activity, now)  # the quiet counts from the signal
        return True

    def draining(self, busy: bool = False) -> bool:
        """After stop(): whether to go on. Call as `d.running or d.draining(...)`."""
        now = time.monotonic()
        if now >= self.deadline:
            return False
        return busy or now - self.last_activity < self.quiet_s


class ReplicaSockets:
    """endpoint -> a PUSH socket to that scheduler replica's inbox, connected the first
    time it is named (a replica that joins later needs no restart here); all closed by
    close(). ValueError for an endpoint that is not one (check_endpoint)."""

    def __init__(self, ctx: zmq.Context | None = None) -> None:
        self._ctx = ctx or zmq.Context.instance()
        self._sockets: dict[str, PushQueue] = {}

    def get(self, endpoint: str) -> PushQueue:
        q = self._sockets.get(endpoint)
        if q is None:
            q = self._sockets[endpoint] = PushQueue(endpoint, bind=False, ctx=self._ctx)
        return q

    def __len__(self) -> int:
        return len(self._sockets)

    def close(self) -> None:
        for q in self._sockets.values():
            q.close()
        self._sockets.clear()


class WorkerShell:
    """One worker's sockets, beats and drain, and the inbox loop (see the module doc).

    `status(kind)` sends the worker's status message of that kind ("ready", "heartbeat",
    "stopping"); `beacon`: liveness from a Heartbeat thread (else from the loop, every
    heartbeat_s); `quiet_s`: Drain's quiet period."""

    def __init__(
        self,
        config: Config,
        component: str,
        inbox: PullQueue,
        status: Callable[[str], None],
        *,
        beacon: bool,
        quiet_s: float,
        ctx: zmq.Context | None = None,
    ) -> None:
        self.config = config
        self.component = component
        self.ctx: zmq.Context = ctx or zmq.Context.instance()
        self.inbox = inbox
        self.to_frontend = FrontendLinks(config, self.ctx)
        self.replicas = ReplicaSockets(self.ctx)
        self.drain = Drain(config.server.drain_timeout_s, quiet_s)
        self.status = status
        self.beacon = beacon
        self.beat_s = config.heartbeat_s
        self.last_beat = 0.0  # monotonic: the last status sent
        self._owned: list[PushQueue | PullQueue | FrontendLinks] = [inbox, self.to_frontend]
        self._heartbeat: Heartbeat | None = None

    def own(self, q: Q) -> Q:
        """A further socket of the worker's, closed with the others."""
        self._owned.append(q)
        return q

    def beat(self, kind: str = "heartbeat") -> None:
        self.status(kind)
        self.last_beat = time.monotonic()

    def start(self) -> None:
        """Say "ready"; start the heartbeat thread if the worker beats from one. What
        start-up built (modules, the model, tokenizers) is frozen out of the cyclic
        collector first, so that a full collection walks only what serving allocates
        (docs/benchmarks.md, "The host's share of a decode step"), and young collections
        come every several steps, not several times a step (common/collector.py)."""
        collector.settle()
        self.beat("ready")
        if self.beacon:
            self._heartbeat = Heartbeat(self.config, self.component).start()

    def finish(self, last_word: Callable[[], None] | None = None) -> None:
        """Stop the heartbeat thread, say "stopping" (or `last_word()`), close every socket;
        start-up's objects go back to the collector (frozen ones are never freed at exit,
        and extension modules such as triton's then report them as leaked)."""
        if self._heartbeat is not None:
            self._heartbeat.stop()
            self._heartbeat = None
        if last_word is None:
            self.beat("stopping")
        else:
            last_word()
        self.close()
        gc.unfreeze()

    def close(self) -> None:
        for q in self._owned:
            q.close()
        self.replicas.close()

    def stop(self, *_args: Any) -> None:
        """SIGTERM / SIGINT: drain (Drain.stop); a second signal stops now."""
        self.drain.stop()

    def run(
        self, handle: Callable[[Message], None], busy: Callable[[], bool] | None = None
    ) -> None:
        """The inbox loop: block for a batch (heartbeat_s, or DRAIN_POLL_MS while
        draining), hand each message to `handle` (an exception costs that message, never
        the worker), beat when due; after stop(), go on while `busy()` or until the inbox
        stays quiet (Drain)."""
        self.start()
        drain, beat_s = self.drain, self.beat_s
        loop_beats = not self.beacon
        beat_ms = int(beat_s * 1000)
        while drain.running or drain.draining(busy is not None and busy()):
            msgs = self.inbox.get_batch(timeout_ms=beat_ms if drain.running else DRAIN_POLL_MS)
            for msg in msgs:
                try:
                    handle(msg)
                except Exception:
                    log.exception(
                        "%s: dropping a %s that failed", self.component, type(msg).__name__
                    )
                if loop_beats and time.monotonic() - self.last_beat >= beat_s:
                    self.beat()  # a long batch: still here
            if msgs:
                drain.touch()  # after handling: a long batch is not quiet
            if loop_beats and time.monotonic() - self.last_beat >= beat_s:
                self.beat()
        self.finish()


def on_stop_signals(stop: Callable[..., Any]) -> None:
    """SIGTERM and SIGINT call `stop` (a worker's drain-then-stop)."""
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
