"""The frontend's side of the pipeline: send requests, route what comes back to them.

```
 route handler ──submit()──▶ the cluster picks replica K and tokenizer worker W
              ──▶ ROUTER bind "tokenizer.I" ──▶ W (its DEALER, identity = its pid)
 release() / interrupts ───▶ PUSH connect replica K's inbox (AbortRequest)
 inbox thread ◀── PULL bind "frontend.I" ◀── TextOutputs (detok), RequestError (any worker),
      │                                    EngineStatus, ComponentStatus,
      │                                    TokenizerReply (frontend.tokenizer_calls)
      └─ call_soon_threadsafe(dispatch, batch) ─▶ event loop ─▶ RequestHandle.queue
                                                              └▶ Cluster (statuses)
```
The client's rules (replica sockets, the inbox thread, routes) are in the room's doc,
frontend/cluster/__init__.py. I is this frontend's id (config.frontend_id, 0 to
api_servers - 1; "frontend.0" is the "frontend" endpoint itself): each frontend process
binds its own two sockets, and the workers send what belongs to a request to the one
whose id it carries (TokenizeRequest.frontend).
"""

from __future__ import annotations

import asyncio
import os
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
    TokenizerCall,
    TokenizeRequest,
    TokenizerReply,
    WireError,
    unpack_text_outputs,
)
from common.zmq_queue import PullQueue
from frontend.cluster.failing import FailingRequests
from frontend.cluster.members import Event, Joined
from frontend.cluster.replica_links import ReplicaLinks
from frontend.cluster.table import WATCHDOG_S, Cluster
from frontend.cluster.tokenizer_link import TokenizerLink
from frontend.errors import APIError, renamed, unavailable
from frontend.frontends import PeerStats, own_figures
from frontend.metrics import Metrics, shown_timings
from frontend.prediction import prediction_counts
from frontend.request_handle import Delta, Receive, RequestHandle
from frontend.tokenizer_calls import TokenizerCalls

log = get_logger("frontend.engine_client")

POLL_MS = 100  # the inbox thread checks for shutdown this often


class EngineClient(FailingRequests):
    def __init__(self, config: Config, metrics: Metrics) -> None:
        self.config = config
        self.metrics = metrics
        self.cluster = Cluster(
            config.heartbeat_s,
            model_name=config.model_name,
            secret=config.ipc.secret,
            routing=config.server.routing,
            data_parallel_size=config.data_parallel_size,
        )
        self.routes: dict[str, tuple[RequestHandle, int]] = {}
        self.frontend_id = config.frontend_id
        # server.max_queued_requests is the server's: each of the frontends takes its share
        self.max_in_flight = -(-config.server.max_queued_requests // config.api_servers)
        self.num_open: dict[int, int] = {}  # replica -> its sub-requests in `routes`
        self.draining = False  # set on SIGTERM: new requests get 503
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tokenizers: TokenizerLink | None = None
        self._ctx: zmq.Context | None = None
        self._inbox: PullQueue | None = None
        self.links: ReplicaLinks | None = None  # the sockets to the replicas, watched
        self._watchdog: asyncio.Task | None = None
        # several frontends: /stats' own figures, shared with the others (frontends.py)
        self.peers = PeerStats(config) if config.api_servers > 1 else None
        # /tokenize, /detokenize, /tokenizer_info: answered by a tokenizer worker
        self.tokenizer_calls = TokenizerCalls(
            self._send_to_tokenizer, config.server.request_timeout_s, config.frontend_id
        )

    # -- lifecycle (on the event loop) --------------------------------------------------
    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        ipc = self.config.ipc
        ctx: zmq.Context = zmq.Context.instance()
        self._ctx = ctx
        me = self.frontend_id
        self._tokenizers = TokenizerLink(ipc.tokenizer_endpoint(me), ctx, self.cluster)
        self._inbox = PullQueue(ipc.frontend_endpoint(me), bind=True, ctx=ctx)
        self.links = ReplicaLinks(ctx, ipc)
        self._watchdog = asyncio.ensure_future(self._watch())
        self._thread = threading.Thread(target=self._recv_loop, name="frontend-inbox", daemon=True)
        self._thread.start()
        log.info(
            "frontend sockets up: tokenizer %s, inbox %s",
            self._tokenizers.queue.endpoint,
            self._inbox.endpoint,
        )

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.fail_remaining()
        if self._watchdog is not None:
            self._watchdog.cancel()
        if self.links is not None:
            self.links.close()  # after the inbox thread stopped: it reads the watches
        for q in (self._tokenizers, self._inbox):
            if q is not None:
                q.close()

    def _act(self, events: list[Event]) -> None:
        """Do what the cluster view asks: connect to a replica that joined, fail what a
        dead component held."""
        for ev in events:
            if isinstance(ev, Joined):
                assert self.links is not None
                self.links.connect(ev.replica, ev.inbox)
            elif ev.rids is not None:
                self.fail_lost(ev.rids, ev.why)
            else:
                self.fail_all(ev.component, ev.why)

    def _on_disconnect(self, names: list[str]) -> None:
        self._act(self.cluster.on_disconnect(names, time.monotonic()))

    async def _watch(self) -> None:
        """The cluster's watchdog: what a dead component took with it fails within one
        liveness window (~3 s); and the frontend's heartbeat to the replicas (our pid: a new
        one means the requests of a dead frontend are orphans)."""
        last_beat = 0.0
        while True:
            await asyncio.sleep(WATCHDOG_S)
            try:
                now = time.monotonic()
                if now - last_beat >= self.config.heartbeat_s:
                    last_beat = now
                    assert self.links is not None
                    self.links.send_all(
                        ComponentStatus(
                            f"frontend.{self.frontend_id}", os.getpid(), "heartbeat", time.time()
                        )
                    )
                self._act(self.cluster.check(now))
                if self.peers is not None:
                    self.peers.publish(own_figures(self.num_open, self.metrics, now))
            except Exception:  # the watchdog must outlive any surprise
                log.exception("component watchdog failed")

    # -- the inbox thread -----------------------------------------------------------------
    def _recv_loop(self) -> None:
        assert self._inbox is not None and self._loop is not None and self.links is not None
        while not self._stop.is_set():
            try:
                msgs = self._inbox.get_batch(timeout_ms=POLL_MS)
            except zmq.ZMQError as e:
                if self._stop.is_set():
                    break
                log.error("inbox receive failed: %s", e)
                time.sleep(POLL_MS / 1000)
                continue
            gone = self.links.gone()
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
                elif isinstance(msg, (EngineStatus, ComponentStatus)):
                    events = self.cluster.on_status(msg, now)
                    if events is not None and isinstance(msg, EngineStatus):
                        self.metrics.on_engine_status(msg)
                    self._act(events or [])
                elif isinstance(msg, TokenizerReply):
                    self.tokenizer_calls.on_reply(msg)
                else:
                    log.warning("dropping unexpected %s on the inbox", type(msg).__name__)
            except Exception:  # a malformed message must never kill the dispatcher
                log.exception("dropping %s that failed to dispatch", type(msg).__name__)

    def _on_outputs(self, msg: TextOutputs, now: float) -> None:
        self.cluster.on_outputs(now, msg.replica)
        try:
            outputs = unpack_text_outputs(msg)
        except WireError as e:
            log.warning("dropping TextOutputs: %s", e)
            return
        if msg.prefix_cache is not None and len(msg.prefix_cache) == 2:
            self.metrics.on_prefix_cache(msg.replica, *msg.prefix_cache)
        routes, cluster = self.routes, self.cluster
        for o in outputs:
            route = routes.get(o.rid)
            if route is None:
                continue
            cluster.forget(o.rid)
            handle, index = route
            timings = o.timings if isinstance(o.timings, dict) else None
            if timings is not None:  # the stages start at the arrival, which stayed here
                timings = {**timings, "arrival_time": handle.arrival_wall}
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
                msg.replica,
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
                    int(timings.get("num_cached_tokens") or 0) if timings is not None else 0,
                    prediction=prediction_counts(timings),
                )
            )

    def _forget(self, rid: str) -> tuple[RequestHandle, int] | None:
        """rid leaves `routes` (finished, failed or aborted): the route, or None."""
        route = self.routes.pop(rid, None)
        if route is not None:
            k = route[0].replica
            self.num_open[k] = max(0, self.num_open.get(k, 0) - 1)
            self.metrics.in_flight.set(len(self.routes))
        return route

    def _on_error(self, msg: RequestError) -> None:
        self.cluster.forget(msg.rid)
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
        arrival_wall: float | None = None,
    ) -> RequestHandle:
        """Send one HTTP request's sub-requests to the tokenizer pool, for one scheduler
        replica: `pin`, else the router's choice (`prefix_key`: see routing). Raises
        APIError 503 when components are missing or too many sub-requests are in flight
        (400 / 503 for a pin out of range / down). A worker's error names parameters as
        the client did (`aliases`, see protocol.param_aliases); stage times reach the
        client only with `return_timings`."""
        if self.draining:
            raise unavailable("server is shutting down", "shutting_down")
        missing = self.cluster.missing()
        if missing:
            raise unavailable(f"server not ready: waiting for {', '.join(missing)}", "not_ready")
        limit = self.max_in_flight
        # (with nothing in flight, one request within the server's whole limit, which
        # intake checked, is taken even when it is more than this frontend's share)
        if self.routes and len(self.routes) + len(reqs) > limit:
            raise unavailable(
                f"too many requests in flight (limit {limit}); retry later", "overloaded"
            )
        replica = self.cluster.choose(pin, prefix_key, self.num_open)
        inbox = self.links.endpoint(replica) if self.links is not None else None
        handle = RequestHandle(
            [r.rid for r in reqs],
            arrival,
            self.config.server.request_timeout_s,
            aliases,
            return_timings,
            arrival_wall,
        )
        handle.replica = replica
        try:
            for i, req in enumerate(reqs):
                worker = await self._send_to_tokenizer(replace(req, replica=replica, inbox=inbox))
                self.routes[req.rid] = (handle, i)
                self.num_open[replica] = self.num_open.get(replica, 0) + 1
                self.metrics.in_flight.set(len(self.routes))
                self.cluster.sent(req.rid, worker)
        except BaseException:
            self.release(handle, "submit_failed")
            raise
        handle.watch(self._interrupt, receive)
        return handle

    async def _send_to_tokenizer(self, req: TokenizeRequest | TokenizerCall) -> int:
        assert self._tokenizers is not None
        return await self._tokenizers.send(req)

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
            self.cluster.forget(rid)
            if self._forget(rid) is None:
                continue
            num += 1
            # what it computed counts, as for finished requests (the last step may be missed)
            self.metrics.on_aborted(
                handle.replica, handle.num_prompt_tokens[index], handle.num_output_tokens[index]
            )
            sent = self.links is None or self.links.send(handle.replica, AbortRequest(rid, reason))
            if not sent:
                log.warning("abort of %s not sent: scheduler queue full", rid)
        if num:
            log.debug("aborted %d sub-request(s) of %s: %s", num, handle.rids[0], reason)
        return num
