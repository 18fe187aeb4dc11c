"""The frontend's ROUTER socket to its tokenizer workers: each request goes to the worker
the cluster table picks (Cluster.choose_tokenizer), addressed by the worker's pid (its
DEALER's identity)."""

from __future__ import annotations

import asyncio
import time

import zmq

from common.messages import TokenizerCall, TokenizeRequest, WireError
from common.zmq_queue import QueueFull, RouterQueue
from frontend.cluster.table import Cluster
from frontend.errors import invalid, unavailable

SEND_RETRY_S = 1.0  # how long a request waits for a tokenizer to take it before 503
SEND_RETRY_SLEEP_S = 0.005


class TokenizerLink:
    def __init__(self, endpoint: str, ctx: zmq.Context, cluster: Cluster) -> None:
        self.queue = RouterQueue(endpoint, ctx=ctx)
        self.cluster = cluster

    async def send(self, req: TokenizeRequest | TokenizerCall) -> int:
        """Send to the tokenizer worker the cluster picks, without blocking; the worker's
        pid. While none takes it (not connected yet: a worker's status can arrive before
        its DEALER connects; or every queue is full) retry briefly."""
        deadline = time.monotonic() + SEND_RETRY_S
        full: set[int] = set()
        while True:
            pid = self.cluster.choose_tokenizer(time.monotonic(), full)
            if pid is not None:
                try:
                    self.queue.put(str(pid).encode(), req)
                    return pid
                except WireError as e:
                    raise invalid(f"request cannot be encoded: {e}") from None
                except QueueFull:
                    full.add(pid)  # another worker may take it now
                    continue
            if time.monotonic() >= deadline:
                raise unavailable("no tokenizer worker is accepting requests", "overloaded")
            full.clear()
            await asyncio.sleep(SEND_RETRY_SLEEP_S)

    def close(self) -> None:
        self.queue.close()
