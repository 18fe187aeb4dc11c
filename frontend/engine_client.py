"""The frontend's side of the pipeline: send requests, route what comes back to them.

```
 route handler ──submit()──▶ routing.Router picks replica K ──▶ PUSH bind "tokenizer"
                                                                 ──▶ tokenizer_worker × N
 release() / interrupts ───▶ PUSH connect replica K's inbox (AbortRequest)
 inbox thread ◀── PULL bind "frontend" ◀── TextOutputs (detok), RequestError (any worker),
      │                                    EngineStatus, ComponentStatus, TokenizeAck,
      │                                    TokenizerReply (frontend.tokenizer_calls)
      └─ call_soon_threadsafe(dispatch, batch) ─▶ event loop ─▶ RequestHandle.queue
                                                              └▶ HealthMonitor (statuses)
```

Data parallelism: one PUSH socket per scheduler replica, connected when the replica joins
(HealthMonitor's replica table calls `_on_join`). The frontend picks the replica before
tokenizing (frontend.routing) and the TokenizeRequest names it, so the tokenizer worker
sends it there; a request's aborts go to that replica (`RequestHandle.replica`).

The inbox is read by one background thread (block once, then drain: one event-loop
wake-up per batch, and msgpack decoding off the loop), so the loop never blocks on
ZeroMQ. The two PUSH sockets are used only from the loop, with non-blocking sends.
`dispatch` runs on the loop and routes each entry of a TextOutputs (one message per
engine step, many requests) through `routes: rid -> (handle, choice index)`. A rid
leaves `routes` when it finishes, fails or is aborted; outputs for rids not in `routes`
(unknown, finished, aborted) are dropped silently. Which components are alive, and what a
dead one took with it, is frontend.health's; it asks this client to fail those requests.
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import replace

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
    TokenizerCall,
    TokenizeRequest,
    TokenizerReply,
    WireError,
    unpack_text_outputs,
)
from common.zmq_queue import PullQueue, PushQueue, QueueFull
from frontend.errors import APIError, invalid, renamed, unavailable
from frontend.health import HealthMonitor, replica_key, replica_of
from frontend.metrics import Metrics, shown_timings
from frontend.request_handle import Delta, Receive, RequestHandle
from frontend.routing import ReplicaLoad, Router
from frontend.tokenizer_calls import TokenizerCalls

log = get_logger("frontend.engine_client")

POLL_MS = 100  # the inbox thread checks for shutdown this often
SEND_RETRY_S = 1.0  # how long a request waits for a tokenizer to take it before 503
SEND_RETRY_SLEEP_S = 0.005


class EngineClient:
    def __init__(self, config: Config, metrics: Metrics) -> None:
        self.config = config
        self.metrics = metrics
        self.health = HealthMonitor(
            config.heartbeat_s,
            self.fail_all,
            self.fail_lost,
            self._send_scheduler,
            model_name=config.model_name,
            secret=config.ipc.secret,
            on_join=self._on_join,
        )
        self.router = Router(config.server.routing)
        self.routes: dict[str, tuple[RequestHandle, int]] = {}
        self.num_open: dict[int, int] = {}  # replica -> its sub-requests in `routes`
        self.draining = False  # set on SIGTERM: new requests get 503
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._to_tokenizer: PushQueue | None = None
        self._ctx: zmq.Context | None = None
        self._to_replicas: dict[int, PushQueue] = {}  # replica -> socket to its inbox
        self._old_sockets: list[PushQueue] = []  # a rejoined replica's old inbox
        self._inbox: PullQueue | None = None
        metrics.in_flight.set_function(lambda: len(self.routes))
        # /tokenize, /detokenize, /tokenizer_info: answered by a tokenizer worker
        self.tokenizer_calls = TokenizerCalls(
            self._send_to_tokenizer, config.server.request_timeout_s
        )

    # -- lifecycle (on the event loop) --------------------------------------------------
    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        ipc = self.config.ipc
        ctx: zmq.Context = zmq.Context.instance()
        self._ctx = ctx
        self._to_tokenizer = PushQueue(ipc.endpoint("tokenizer"), bind=True, ctx=ctx)
        self._inbox = PullQueue(ipc.endpoint("frontend"), bind=True, ctx=ctx)
        self.health.start(ipc.endpoint("detok"), ctx)
        self._thread = threading.Thread(target=self._recv_loop, name="frontend-inbox", daemon=True)
        self._thread.start()
        log.info(
            "frontend sockets up: tokenizer %s, inbox %s",
            self._to_tokenizer.endpoint,
            self._inbox.endpoint,
        )

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.fail_remaining()
        self.health.close()
        for q in (self._to_tokenizer, self._inbox, *self._to_replicas.values(), *self._old_sockets):
            if q is not None:
                q.close()

    def _on_join(self, replica: int, inbox: str | None) -> None:
        """A replica joined (or rejoined at another inbox): connect to its inbox."""
        ep = inbox or self.config.ipc.replica_endpoint(replica)
        old = self._to_replicas.get(replica)
        if old is not None and old.endpoint == ep:
            return
        q = PushQueue(ep, bind=False, ctx=self._ctx)
        if old is not None:
            self._old_sockets.append(old)  # its watch may still be read: closed at the end
        self._to_replicas[replica] = q
        self.health.watch_replica(replica, q.socket)

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
            gone = self.health.peers_gone()
            try:
                if msgs:
                    self._loop.call_soon_threadsafe(self.dispatch, msgs)
                if gone:  # after the messages it sent before it died
                    self._loop.call_soon_threadsafe(self.health.on_disconnect, gone)
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
                    if self.health.on_engine_status(msg, now):
                        self.metrics.on_engine_status(msg)
                elif isinstance(msg, ComponentStatus):
                    self.health.on_component(msg, now)
                elif isinstance(msg, TokenizeAck):
                    self.health.handoffs.on_ack(msg)
                elif isinstance(msg, TokenizerReply):
                    self.tokenizer_calls.on_reply(msg)
                else:
                    log.warning("dropping unexpected %s on the inbox", type(msg).__name__)
            except Exception:  # a malformed message must never kill the dispatcher
                log.exception("dropping %s that failed to dispatch", type(msg).__name__)

    def _on_outputs(self, msg: TextOutputs, now: float) -> None:
        self.health.liveness.on_outputs(now, msg.replica)
        try:
            outputs = unpack_text_outputs(msg)
        except WireError as e:
            log.warning("dropping TextOutputs: %s", e)
            return
        routes, handoffs = self.routes, self.health.handoffs
        for o in outputs:
            route = routes.get(o.rid)
            if route is None:
                continue
            if handoffs:
                handoffs.forget(o.rid)
            handle, index = route
            timings = o.timings if isinstance(o.timings, dict) else None
            if o.finish_reason is not None:
                self._forget(o.rid)
            self.metrics.on_output(
                handle,
                index,
                o.num_prompt_tokens,
                o.num_output_tokens,
                o.finish_reason,
                timings,
                now,
            )
            handle.queue.put_nowait(
                Delta(
                    index,
                    o.text,
                    o.finish_reason,
                    o.stop_reason,
                    o.num_prompt_tokens,
                    o.num_output_tokens,
                    o.token_ids,
                    o.logprobs,
                    shown_timings(timings) if handle.return_timings else None,
                    o.prompt_logprobs,
                )
            )

    def _forget(self, rid: str) -> tuple[RequestHandle, int] | None:
        """rid leaves `routes` (finished, failed or aborted): the route, or None."""
        route = self.routes.pop(rid, None)
        if route is not None:
            k = route[0].replica
            self.num_open[k] = max(0, self.num_open.get(k, 0) - 1)
        return route

    def _on_error(self, msg: RequestError) -> None:
        self.health.handoffs.forget(msg.rid)
        route = self._forget(msg.rid)
        if route is None:
            return
        status = msg.status if 400 <= msg.status <= 599 else 500
        route[0].queue.put_nowait(
            renamed(APIError(status, msg.message, msg.type, msg.param), route[0].aliases)
        )

    # -- requests (on the event loop) -----------------------------------------------------
    async def submit(
        self,
        reqs: list[TokenizeRequest],
        arrival: float,
        receive: Receive | None = None,
        aliases: dict[str, str] | None = None,
        return_timings: bool = False,
        pin: int | None = None,
        prefix_key: bytes | None = None,
    ) -> RequestHandle:
        """Send one HTTP request's sub-requests to the tokenizer pool, for one scheduler
        replica: `pin`, else the router's choice (`prefix_key`: see routing). Raises
        APIError 503 when components are missing or too many sub-requests are in flight
        (400 / 503 for a pin out of range / down). A worker's error names parameters as
        the client did (`aliases`, see protocol.param_aliases); stage times reach the
        client only with `return_timings`."""
        if self.draining:
            raise unavailable("server is shutting down", "shutting_down")
        missing = self.health.liveness.missing()
        if missing:
            raise unavailable(f"server not ready: waiting for {', '.join(missing)}", "not_ready")
        limit = self.config.server.max_queued_requests
        if len(self.routes) + len(reqs) > limit:
            raise unavailable(
                f"too many requests in flight (limit {limit}); retry later", "overloaded"
            )
        replica = self.pick_replica(pin, prefix_key)
        inbox = self._to_replicas[replica].endpoint if replica in self._to_replicas else None
        handle = RequestHandle(
            [r.rid for r in reqs],
            arrival,
            self.config.server.request_timeout_s,
            aliases,
            return_timings,
        )
        handle.replica = replica
        try:
            for i, req in enumerate(reqs):
                await self._send_to_tokenizer(replace(req, replica=replica, inbox=inbox))
                self.routes[req.rid] = (handle, i)
                self.num_open[replica] = self.num_open.get(replica, 0) + 1
                self.health.handoffs.sent(req.rid, time.monotonic())
        except BaseException:
            self.release(handle, "submit_failed")
            raise
        handle.watch(self._interrupt, receive)
        return handle

    def pick_replica(self, pin: int | None, prefix_key: bytes | None) -> int:
        """The replica for a new request: `pin` (400 when no such replica can exist, 503
        when it is down), else the least loaded, with prefix affinity (routing.Router)."""
        now = time.monotonic()
        alive = self.health.liveness.alive_replicas(now)
        if pin is not None:
            known = set(self.health.liveness.engines) | set(range(self.config.data_parallel_size))
            if pin < 0 or pin not in known:
                raise APIError(
                    400,
                    f"data_parallel_rank {pin} is out of range: the replicas are {sorted(known)}",
                    param="data_parallel_rank",
                )
            if pin not in alive:
                raise unavailable(f"scheduler replica {pin} is down", "replica_unavailable")
            return pin
        engines = self.health.liveness.engines
        loads = [
            ReplicaLoad(
                k,
                engines[k].num_waiting,
                engines[k].num_running,
                engines[k].kv_usage,
                self.num_open.get(k, 0),
            )
            for k in alive
        ]
        if not loads:  # admission checked that one is alive; a race with its death
            raise unavailable("no scheduler replica is serving", "not_ready")
        return self.router.pick(loads, prefix_key)

    async def _send_to_tokenizer(self, req: TokenizeRequest | TokenizerCall) -> None:
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
                    raise unavailable(
                        "no tokenizer worker is accepting requests", "overloaded"
                    ) from None
            await asyncio.sleep(SEND_RETRY_SLEEP_S)

    def release(self, handle: RequestHandle, reason: str) -> None:
        """The HTTP side is done with `handle`: stop its watchers and abort whatever of it
        still runs (reason e.g. "client_disconnect" when a stream was cut). Idempotent."""
        if handle.released:
            return
        handle.released = True
        handle.cancel_watchers()
        self._abort_running(handle, reason)

    def _interrupt(self, handle: RequestHandle, reason: str, exc: Exception) -> None:
        """Abort the handle's running sub-requests and wake its consumer with `exc`."""
        if self._abort_running(handle, reason):
            handle.queue.put_nowait(exc)

    def _abort_running(self, handle: RequestHandle, reason: str) -> int:
        num = 0
        for index, rid in enumerate(handle.rids):
            self.health.handoffs.forget(rid)
            if self._forget(rid) is None:
                continue
            num += 1
            # what it computed counts, as for finished requests (the last step may be missed)
            self.metrics.on_aborted(
                handle.num_prompt_tokens[index], handle.num_output_tokens[index]
            )
            if not self._send_replica(handle.replica, AbortRequest(rid, reason)):
                log.warning("abort of %s not sent: scheduler queue full", rid)
        if num:
            log.debug("aborted %d sub-request(s) of %s: %s", num, handle.rids[0], reason)
        return num

    def _send_replica(self, replica: int, msg: Message) -> bool:
        q = self._to_replicas.get(replica)
        if q is None or q.socket.closed:
            return True
        try:
            q.put(msg)
            return True
        except QueueFull:
            return False

    def _send_scheduler(self, msg: Message) -> bool:
        """To every replica (the frontend's heartbeat)."""
        return all([self._send_replica(k, msg) for k in list(self._to_replicas)])

    # -- failing what runs (on the event loop) -------------------------------------------
    def fail_all(self, component: str, why: str) -> None:
        """What `component` held fails with 503: a replica's ("scheduler.K") requests, or
        every request in flight (the detok); the replicas are told to abort them."""
        key = replica_key(component)
        replica = None if key is None else replica_of(key)
        if replica is not None:
            self.metrics.replica_down(replica)
        handles = {
            id(h): h for h, _ in self.routes.values() if replica is None or h.replica == replica
        }
        if not handles:
            return
        log.error("%s %s: failing %d request(s) in flight", component, why, len(handles))
        for handle in handles.values():
            self._interrupt(
                handle,
                f"{component}_failed",
                APIError(
                    503,
                    f"the {component} process failed while serving this request; it was not "
                    "completed, retry it",
                    "server_error",
                    None,
                    "component_failed",
                ),
            )

    def fail_lost(self, rids: list[str], why: str) -> None:
        """Fail the requests of `rids` (a dead or hung tokenizer worker held them)."""
        handles = {id(route[0]): route[0] for rid in rids if (route := self.routes.get(rid))}
        if handles:
            log.error("%s: failing %d request(s) it had not started", why, len(handles))
        for handle in handles.values():
            self._interrupt(
                handle,
                "tokenizer_failed",
                APIError(
                    503,
                    "the tokenizer worker holding this request stopped before starting it; "
                    "retry it",
                    "server_error",
                    None,
                    "component_failed",
                ),
            )

    def fail_remaining(self) -> None:
        """What still runs at shutdown (past the drain) ends with a 503, streams with an
        error event, instead of a cut connection."""
        for handle, _ in list(self.routes.values()):
            self._interrupt(
                handle,
                "shutdown",
                unavailable("server is shutting down; the request was not completed", "shutdown"),
            )

    def fail_remaining_threadsafe(self) -> None:
        """fail_remaining, from another thread (the drain timer)."""
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self.fail_remaining)
