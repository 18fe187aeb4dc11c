"""`FrontendLinks`: a worker's sockets to the frontends, one PUSH per frontend inbox.

With `api_servers` N, N frontend processes share the HTTP port, each with its own inbox
(IPCConfig.frontend_endpoint). What belongs to one request (its outputs, its error, a
tokenizer call's reply) goes to the frontend that accepted it, named by the request's
`frontend` id; statuses go to every frontend, since each keeps its own table of the
components (frontend.cluster).
"""

from __future__ import annotations

import contextlib

import zmq

from common.config import Config
from common.messages import Message
from common.zmq_queue import PushQueue, QueueFull


class FrontendLinks:
    """One PUSH socket to each frontend's inbox, frontends 0..config.api_servers - 1
    (IPCConfig.frontend_endpoint). `put(msg, frontend)` sends to one: a request's error,
    reply or outputs go to the frontend that accepted it; `broadcast` sends a status to
    every one (each keeps its own table of the components). With one frontend, `put` is
    exactly the single socket's."""

    def __init__(self, config: Config, ctx: zmq.Context | None = None) -> None:
        ctx = ctx or zmq.Context.instance()
        self.queues = [
            PushQueue(config.ipc.frontend_endpoint(i), bind=False, ctx=ctx)
            for i in range(config.api_servers)
        ]

    def __len__(self) -> int:
        return len(self.queues)

    def put(self, msg: Message, frontend: int = 0, timeout_ms: int | None = 0) -> None:
        """PushQueue.put to frontend `frontend`; an id out of range (a peer's bug or a
        config that changed under a running worker) is a QueueFull, as a gone peer."""
        if not 0 <= frontend < len(self.queues):
            raise QueueFull(f"no frontend {frontend} (api_servers {len(self.queues)})")
        self.queues[frontend].put(msg, timeout_ms)

    def broadcast(self, msg: Message) -> int:
        """Send `msg` to every frontend without blocking; how many took it."""
        sent = 0
        for q in self.queues:
            with contextlib.suppress(QueueFull):
                q.put(msg)
                sent += 1
        return sent

    def close(self) -> None:
        for q in self.queues:
            q.close()
