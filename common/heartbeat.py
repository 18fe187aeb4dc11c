"""A worker's liveness beacon, on its own thread and socket.

The frontend judges a component dead after ~3 heartbeats of silence. Beating from the
worker's main loop would make a long engine step (a big prefill on a slow or busy CPU)
look like a death and fail every request in flight; a thread keeps beating while the
main thread is inside torch (which releases the GIL), so silence means the process is
gone or wedged, not busy.
"""

from __future__ import annotations

import os
import threading
import time

import zmq

from common.config import Config
from common.frontend_links import FrontendLinks
from common.log import get_logger
from common.messages import ComponentStatus

log = get_logger("heartbeat")


class Heartbeat:
    def __init__(self, config: Config, component: str) -> None:
        self.config = config
        self.component = component
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name=f"{component}-heartbeat", daemon=True
        )

    def start(self) -> Heartbeat:
        self._thread.start()
        return self

    def _run(self) -> None:
        # a socket of its own: zmq sockets must not be shared between threads
        q = FrontendLinks(self.config, zmq.Context.instance())
        try:
            while not self._stop.wait(self.config.heartbeat_s):
                q.broadcast(ComponentStatus(self.component, os.getpid(), "heartbeat", time.time()))
        finally:
            q.close()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
