"""The frontend's ZeroMQ side: send requests and aborts, route the inbox to waiting requests.

```
 route handler ──submit()──▶ PUSH bind "tokenizer"  ──▶ tokenizer_worker × N
 release()/watchers ───────▶ PUSH connect "scheduler" (AbortRequest)
 inbox thread ◀── PULL bind "frontend" ◀── TextOutputs (detok), RequestError (any worker),
      │                                    EngineStatus (scheduler), ComponentStatus (all)
      └─ call_soon_threadsafe(dispatch, batch) ─▶ event loop ─▶ RequestHandle.queue
```

The inbox is read by one background thread (block once, then drain: one event-loop
wake-up per batch, and msgpack decoding off the loop), so the loop never blocks on
ZeroMQ. The two PUSH sockets are used only from the loop, with non-blocking sends.
`dispatch` runs on the loop and routes each entry of a TextOutputs (one message per
engine step, many requests) through `routes: rid -> (handle, choice index)`. A rid
leaves `routes` when it finishes, fails or is aborted; outputs for rids not in `routes`
(unknown, finished, aborted) are dropped silently.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import zmq

from common.config import Config
from common.log import get_logger
from common.messages import (
    AbortRequest,
    ComponentStatus,
    EngineStatus,
    Message,
    RequestError,
    TextOutputs,
    TokenizeAck,
    TokenizeRequest,
    WireError,
    unpack_text_outputs,
)
from common.zmq_queue import PeerWatch, PullQueue, PushQueue, QueueFull
from frontend.errors import APIError, invalid, renamed, unavailable
from frontend.handoffs import ACK_GRACE_S, TokenizerHandoffs
from frontend.liveness import COMPONENTS, Liveness
from frontend.metrics import Metrics, stage_durations
from frontend.request_handle import ClientDisconnected, Delta, RequestHandle

log = get_logger("frontend.engine_client")

POLL_MS = 100  # the inbox thread checks for shutdown this often
WATCHDOG_S = 0.2  # how often component liveness is checked for failures
SEND_RETRY_S = 1.0  # how long a request waits for a tokenizer to take it before 503
SEND_RETRY_SLEEP_S = 0.005


class EngineClient:
    def __init__(self, config: Config, metrics: Metrics) -> None:
        self.config = config
        self.metrics = metrics
        self.liveness = Liveness(config.heartbeat_s)
        self.routes: dict[str, tuple[RequestHandle, int]] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._to_tokenizer: PushQueue | None = None
        self._to_scheduler: PushQueue | None = None
        self._inbox: PullQueue | None = None
        self._detok_probe: PushQueue | None = None  # connected only to watch the detok
        self._watches: dict[str, PeerWatch] = {}  # read by the inbox thread only
        self._watchdog: asyncio.Task | None = None
        self.draining = False  # set on SIGTERM: new requests get 503
        self.handoffs = TokenizerHandoffs()  # which tokenizer worker holds which rid
        self._alive = {name: False for name in COMPONENTS}
        self._pids: dict[str, int] = {}  # scheduler / detok pid last heard
        metrics.in_flight.set_function(lambda: len(self.routes))

    # -- lifecycle (on the event loop) --------------------------------------------------
    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        ipc = self.config.ipc
        ctx: zmq.Context = zmq.Context.instance()
        self._to_tokenizer = PushQueue(ipc.endpoint("tokenizer"), bind=True, ctx=ctx)
        self._to_scheduler = PushQueue(ipc.endpoint("scheduler"), bind=False, ctx=ctx)
        self._inbox = PullQueue(ipc.endpoint("frontend"), bind=True, ctx=ctx)
        self._detok_probe = PushQueue(ipc.endpoint("detok"), bind=False, ctx=ctx)
        self._watches = {"scheduler": PeerWatch(self._to_scheduler.socket),
                         "detok": PeerWatch(self._detok_probe.socket)}  # fmt: skip
        self._thread = threading.Thread(target=self._recv_loop, name="frontend-inbox", daemon=True)
        self._thread.start()
        self._watchdog = asyncio.ensure_future(self._watch_components())
        log.info("frontend sockets up: tokenizer %s, inbox %s", self._to_tokenizer.endpoint,
                 self._inbox.endpoint)  # fmt: skip

    def close(self) -> None:
        self._stop.set()
        if self._watchdog is not None:
            self._watchdog.cancel()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.fail_remaining()
        for watch in self._watches.values():
            watch.close()
        for q in (self._to_tokenizer, self._to_scheduler, self._inbox, self._detok_probe):
            if q is not None:
                q.close()

    def fail_remaining(self) -> None:
        """What still runs at shutdown (past the drain) ends with a 503, streams with an
        error event, instead of a cut connection."""
        for handle, _ in list(self.routes.values()):
            self._interrupt(handle, "shutdown", unavailable(
                "server is shutting down; the request was not completed", "shutdown"))

    def fail_remaining_threadsafe(self) -> None:
        """fail_remaining, from another thread (the drain timer)."""
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self.fail_remaining)

    # -- the inbox thread -----------------------------------------------------------------
    def _recv_loop(self) -> None:
        assert self._inbox is not None and self._loop is not None
        while not self._stop.is_set():
            try:
                msgs = self._inbox.get_batch(timeout_ms=POLL_MS)
            except zmq.ZMQError as e:
                if self._stop.is_set():
                    break
                log.error("inbox receive failed: %s", e)
                time.sleep(POLL_MS / 1000)
                continue
            gone = [name for name, watch in self._watches.items() if watch.gone()]
            try:
                if msgs:
                    self._loop.call_soon_threadsafe(self.dispatch, msgs)
                if gone:  # after the messages it sent before it died
                    self._loop.call_soon_threadsafe(self._on_disconnect, gone)
            except RuntimeError:  # the loop is closed: shutting down
                break

    # -- dispatch (on the event loop) -----------------------------------------------------
    def dispatch(self, msgs: list[Message]) -> None:
        now = time.monotonic()
        for msg in msgs:
            try:
                if isinstance(msg, TextOutputs):
                    self._on_outputs(msg, now)
                elif isinstance(msg, RequestError):
                    self._on_error(msg)
                elif isinstance(msg, EngineStatus):
                    self.liveness.on_engine_status(msg, now)
                    self.metrics.on_engine_status(msg)
                elif isinstance(msg, ComponentStatus):
                    self._on_component(msg)
                    self.liveness.on_component(msg, now)
                elif isinstance(msg, TokenizeAck):
                    self.handoffs.on_ack(msg)
                else:
                    log.warning("dropping unexpected %s on the inbox", type(msg).__name__)
            except Exception:  # a malformed message must never kill the dispatcher
                log.exception("dropping %s that failed to dispatch", type(msg).__name__)

    def _on_outputs(self, msg: TextOutputs, now: float) -> None:
        self.liveness.on_outputs(now)
        try:
            outputs = unpack_text_outputs(msg)
        except WireError as e:
            log.warning("dropping TextOutputs: %s", e)
            return
        routes, metrics, handoffs = self.routes, self.metrics, self.handoffs
        for o in outputs:
            rid = o.rid
            route = routes.get(rid)
            if route is None:
                continue
            if handoffs:
                handoffs.forget(rid)
            handle, index = route
            finish = o.finish_reason
            num_out = o.num_output_tokens
            timings = o.timings
            if timings is not None and not isinstance(timings, dict):
                timings = None
            num_new = num_out - handle.num_output_tokens[index]
            if num_new > 0:
                metrics.on_tokens(now, handle.arrival, handle.first_token_at[index],
                                  handle.last_token_at[index], num_new)  # fmt: skip
                if handle.first_token_at[index] is None:
                    handle.first_token_at[index] = now
                handle.last_token_at[index] = now
                handle.num_output_tokens[index] = num_out
            handle.num_prompt_tokens[index] = o.num_prompt_tokens
            if finish is not None:
                del routes[rid]
                metrics.on_finished(finish, now - handle.arrival, o.num_prompt_tokens,
                                    num_out, timings)  # fmt: skip
            shown = None  # stage times go to the client only when it asked (return_timings)
            if timings is not None and handle.return_timings:
                shown = {k: round(v * 1e3, 3) for k, v in stage_durations(timings).items()}
                shown = {k.removesuffix("_s") + "_ms": v for k, v in shown.items()}
            handle.queue.put_nowait(Delta(
                index, o.text, finish, o.stop_reason, o.num_prompt_tokens, num_out, o.token_ids,
                o.logprobs, shown,
            ))  # fmt: skip

    def _on_error(self, msg: RequestError) -> None:
        self.handoffs.forget(msg.rid)
        route = self.routes.pop(msg.rid, None)
        if route is None:
            return
        status = msg.status if 400 <= msg.status <= 599 else 500
        route[0].queue.put_nowait(renamed(APIError(status, msg.message, msg.type, msg.param),
                                          route[0].aliases))  # fmt: skip

    # -- component failures (on the event loop) -----------------------------------------
    def _on_component(self, msg: ComponentStatus) -> None:
        """A scheduler or detok with a new pid restarted: what the old one held is gone."""
        if msg.component not in ("scheduler", "detok"):
            return
        old = self._pids.get(msg.component)
        self._pids[msg.component] = msg.pid
        if old is not None and old != msg.pid:
            self.fail_all(msg.component, f"restarted (pid {old} -> {msg.pid})")

    def _on_disconnect(self, names: list[str]) -> None:
        """The scheduler's or detok's connection closed: the process is gone. What it held
        fails now, and /health says so, without waiting for its heartbeats to lapse."""
        now = time.monotonic()
        for name in names:
            self.liveness.on_disconnect(name, now)
            if self._alive[name]:
                self._alive[name] = False
                self.fail_all(name, "disconnected")

    async def _watch_components(self) -> None:
        """Fail what a dead component took with it, within one liveness window (~3 s)."""
        last_beat = 0.0
        while True:
            await asyncio.sleep(WATCHDOG_S)
            try:
                now = time.monotonic()
                if now - last_beat >= self.config.heartbeat_s:  # tells the scheduler our pid:
                    last_beat = now  # a new one means requests of a dead frontend are orphans
                    self._send_scheduler(ComponentStatus("frontend", os.getpid(), "heartbeat",
                                                         time.time()))  # fmt: skip
                dead = self.handoffs.newly_dead(self.liveness.dead_tokenizers(now))  # before
                missing = self.liveness.missing(now)  # this prunes long-silent tokenizers
                for name in ("scheduler", "detok"):
                    alive = name not in missing
                    if self._alive[name] and not alive:
                        self.fail_all(name, "stopped responding")
                    self._alive[name] = alive
                if dead:
                    self.fail_unacked(now, f"tokenizer worker(s) {sorted(dead)} stopped", dead)
                elif self.handoffs.unacked:  # a worker that hangs but keeps its socket still gets
                    # its share of new requests: none may wait out the request timeout
                    self.fail_unacked(now, "a tokenizer worker is not taking requests",
                                      grace_s=self.liveness.window_s)  # fmt: skip
                self.handoffs.prune(set(self.liveness.tokenizers))
            except Exception:  # the watchdog must outlive any surprise
                log.exception("component watchdog failed")

    def fail_all(self, component: str, why: str) -> None:
        """Every request in flight fails with 503; the scheduler is told to abort them."""
        handles = {id(h): h for h, _ in self.routes.values()}
        if not handles:
            return
        log.error("%s %s: failing %d request(s) in flight", component, why, len(handles))
        for handle in handles.values():
            self._interrupt(handle, f"{component}_failed", APIError(
                503, f"the {component} process failed while serving this request; it was not "
                     "completed, retry it", "server_error", None, "component_failed"))  # fmt: skip

    def fail_unacked(self, now: float, why: str, dead: set[int] | frozenset[int] = frozenset(),
                     grace_s: float = ACK_GRACE_S) -> None:  # fmt: skip
        """Fail the requests a dead or hung tokenizer worker holds (TokenizerHandoffs.lost)."""
        handles = {}
        for rid in self.handoffs.lost(now, dead, grace_s):
            route = self.routes.get(rid)
            if route is not None:
                handles[id(route[0])] = route[0]
        if handles:
            log.error("%s: failing %d request(s) it had not started", why, len(handles))
        for handle in handles.values():
            self._interrupt(handle, "tokenizer_failed", APIError(
                503, "the tokenizer worker holding this request stopped before starting it; "
                     "retry it", "server_error", None, "component_failed"))  # fmt: skip

    # -- requests (on the event loop) -----------------------------------------------------
    async def submit(self, reqs: list[TokenizeRequest], arrival: float,
                     receive: Callable[[], Awaitable[MutableMapping[str, Any]]] | None = None,
                     aliases: dict[str, str] | None = None,
                     return_timings: bool = False) -> RequestHandle:  # fmt: skip
        """Send one HTTP request's sub-requests to the tokenizer pool. Raises APIError 503
        when components are missing or too many sub-requests are in flight. A worker's
        error names parameters as the client did (`aliases`, see protocol.param_aliases);
        stage times reach the client only with `return_timings`."""
        if self.draining:
            raise unavailable("server is shutting down", "shutting_down")
        missing = self.liveness.missing()
        if missing:
            raise unavailable(f"server not ready: waiting for {', '.join(missing)}", "not_ready")
        limit = self.config.server.max_queued_requests
        if len(self.routes) + len(reqs) > limit:
            raise unavailable(f"too many requests in flight (limit {limit}); retry later",
                              "overloaded")  # fmt: skip
        handle = RequestHandle([r.rid for r in reqs], arrival, self.config.server.request_timeout_s,
                               return_timings)  # fmt: skip
        handle.aliases = aliases or {}
        try:
            for i, req in enumerate(reqs):
                await self._send_to_tokenizer(req)
                self.routes[req.rid] = (handle, i)
                self.handoffs.sent(req.rid, time.monotonic())
        except BaseException:
            self.release(handle, "submit_failed")
            raise
        assert self._loop is not None
        handle.timer = self._loop.call_later(
            handle.timeout_s, self._interrupt, handle, "timeout",
            APIError(504, f"request timed out after {handle.timeout_s:g} s", "server_error",
                     None, "timeout"),
        )  # fmt: skip
        if receive is not None:
            handle.watcher = asyncio.ensure_future(self._watch_disconnect(handle, receive))
        return handle

    async def _send_to_tokenizer(self, req: TokenizeRequest) -> None:
        """Non-blocking send; while no tokenizer takes it (none connected yet: a worker's
        status can arrive before its PULL connects; or the queue is full) retry briefly."""
        assert self._to_tokenizer is not None
        deadline = time.monotonic() + SEND_RETRY_S
        while True:
            try:
                self._to_tokenizer.put(req)
                return
            except WireError as e:
                raise invalid(f"request cannot be encoded: {e}") from None
            except QueueFull:
                if time.monotonic() >= deadline:
                    raise unavailable("no tokenizer worker is accepting requests",
                                      "overloaded") from None  # fmt: skip
            await asyncio.sleep(SEND_RETRY_SLEEP_S)

    async def _watch_disconnect(self, handle: RequestHandle,
                                receive: Callable[[], Awaitable[MutableMapping[str, Any]]]) -> None:  # fmt: skip
        """Wait for the ASGI http.disconnect (the body was read already), then abort."""
        try:
            while (await receive())["type"] != "http.disconnect":
                pass
        except Exception:  # receive() failing means the connection is unusable anyway
            pass
        handle.watcher = None  # finished: nothing to cancel
        self._interrupt(handle, "client_disconnect", ClientDisconnected())

    def _interrupt(self, handle: RequestHandle, reason: str, exc: Exception) -> None:
        """Abort the handle's running sub-requests and wake its consumer with `exc`."""
        if self._abort_running(handle, reason):
            handle.queue.put_nowait(exc)

    def _abort_running(self, handle: RequestHandle, reason: str) -> int:
        num = 0
        for index, rid in enumerate(handle.rids):
            self.handoffs.forget(rid)
            if self.routes.pop(rid, None) is None:
                continue
            num += 1
            # what it computed counts, as for finished requests (the last step may be missed)
            self.metrics.on_aborted(handle.num_prompt_tokens[index],
                                    handle.num_output_tokens[index])  # fmt: skip
            if not self._send_scheduler(AbortRequest(rid, reason)):
                log.warning("abort of %s not sent: scheduler queue full", rid)
        if num:
            log.debug("aborted %d sub-request(s) of %s: %s", num, handle.rids[0], reason)
        return num

    def _send_scheduler(self, msg: Message) -> bool:
        q = self._to_scheduler
        if q is None or q.socket.closed:
            return True
        try:
            q.put(msg)
            return True
        except QueueFull:
            return False

    def release(self, handle: RequestHandle, reason: str) -> None:
        """The HTTP side is done with `handle`: stop its watchers and abort whatever of it
        still runs (reason e.g. "client_disconnect" when a stream was cut). Idempotent."""
        if handle.released:
            return
        handle.released = True
        handle.cancel_watchers()
        self._abort_running(handle, reason)
