"""`run(config)`: serve the frontend app with uvicorn on server.host:port.

The HTTP port opens at once; until every component has reported in, /health and every
generation request answer 503 (code "not_ready") naming what is missing, so the
components may start in any order. Readiness is `GET /health` == 200. With
server.listen_when_ready (launch.py sets it) the port opens only once every component is
up, at most server.startup_timeout_s after start (then the frontend exits 1).

SIGTERM/SIGINT drain: new requests get 503 ("shutting_down") and /health turns 503 at
once, requests in flight run to their end for up to server.drain_timeout_s; whatever
still runs then is failed (503, or an SSE error event on a stream) and aborted, and
uvicorn stops. A second signal stops at once. The process then exits 0.
"""

from __future__ import annotations

import signal
import threading
import time
from types import FrameType

import uvicorn

from common.config import Config
from common.log import get_logger, install_stack_dump
from frontend.app import create_app
from frontend.frontends import shared_port_socket

log = get_logger("frontend")

FLUSH_S = 0.5  # after failing what outlived the drain: time to write those error responses


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, app_config: Config, client) -> None:
        super().__init__(config)
        self.app_config = app_config
        self.client = client

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.client.draining or not self.started:  # a second signal, or still starting
            self.force_exit = self.client.draining
            self.client.draining = True  # also ends a startup still waiting for components
            super().handle_exit(sig, frame)
            return
        self.client.draining = True
        timeout = self.app_config.server.drain_timeout_s
        log.info(
            "%s: draining %d request(s) for at most %.0f s",
            signal.Signals(sig).name,
            len(self.client.routes),
            timeout,
        )
        threading.Thread(target=self._drain, args=(sig, timeout), daemon=True).start()

    def _drain(self, sig: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while self.client.routes and time.monotonic() < deadline:
            time.sleep(0.05)
        if self.client.routes:
            log.warning(
                "drain timeout: %d request(s) still running are failed", len(self.client.routes)
            )
            # their responses end with an error (status or SSE event) before uvicorn stops
            self.client.fail_remaining_threadsafe()
            time.sleep(FLUSH_S)
        super().handle_exit(sig, None)


def run(config: Config) -> None:
    install_stack_dump()
    app = create_app(config)
    server = DrainingServer(
        uvicorn.Config(
            app,
            host=config.server.host,
            port=config.server.port,
            lifespan="on",
            access_log=False,
            log_level="info",
            timeout_graceful_shutdown=5,
        ),
        config,
        app.state.client,
    )
    log.info(
        "frontend starting on http://%s:%d (model %s)",
        config.server.host,
        config.server.port,
        config.model_name,
    )
    host = config.server.host
    if config.server.api_key is None and not (
        host in ("localhost", "::1") or host.startswith("127.")
    ):
        log.warning(
            "listening on %s without an API key: anyone who can reach this port can "
            "generate (set ZEROSERVE_API_KEY or --api-key)",
            host,
        )
    # uvicorn re-raises the stop signal once it is done; with these no-op handlers in place
    # (restored by uvicorn after serving) a drained stop exits 0 instead of dying by signal
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: None)
    if config.api_servers > 1:  # one of several on the port (frontend.frontends)
        log.info("frontend %d of %d", config.frontend_id, config.api_servers)
        server.run(sockets=[shared_port_socket(config.server.host, config.server.port)])
    else:
        server.run()
    if not server.started:
        raise SystemExit(1)
