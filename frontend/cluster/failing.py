"""How EngineClient fails what a component took with it (a mixin of the client): a dead
replica's or detok's requests, a dead tokenizer worker's, what outlives the drain at
shutdown. Each handle gets a 503 (or an SSE error event) and its running sub-requests are
aborted at their replica (EngineClient._interrupt). On the event loop, except
fail_remaining_threadsafe.
"""

from __future__ import annotations

import asyncio

from common.log import get_logger
from frontend.cluster.members import replica_key, replica_of
from frontend.errors import unavailable
from frontend.metrics import Metrics
from frontend.request_handle import RequestHandle

log = get_logger("frontend.engine_client")


class FailingRequests:
    routes: dict[str, tuple[RequestHandle, int]]
    metrics: Metrics
    _loop: asyncio.AbstractEventLoop | None

    def _interrupt(self, handle: RequestHandle, reason: str, exc: Exception) -> None:
        raise NotImplementedError  # EngineClient's

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
                unavailable(
                    f"the {component} process failed while serving this request; it was not "
                    "completed, retry it",
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
                unavailable(
                    "the tokenizer worker holding this request stopped before starting it; "
                    "retry it",
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
