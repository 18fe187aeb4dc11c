"""The real frontend app under uvicorn (a background thread, 127.0.0.1, a free port) in
front of a FakeBackend thread, over ipc sockets in a short private run dir."""

from __future__ import annotations

import contextlib
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import uvicorn

from common.config import Config, IPCConfig, ServerConfig
from common.endpoints import ensure_run_dir
from frontend.app import create_app
from tests.frontend.fake_backend import FakeBackend


@dataclass
class Served:
    url: str
    config: Config
    backend: FakeBackend
    app: object

    def client(self, **kwargs) -> httpx.Client:
        return httpx.Client(base_url=self.url, **{"timeout": 10.0, **kwargs})


def requests_for(served: Served, response_id: str) -> list:
    """The requests the fake backend received for one response (rids `<id>-<choice>`)."""
    with served.backend.lock:
        return sorted(
            (r for r in served.backend.requests if r.rid.startswith(response_id + "-")),
            key=lambda r: r.rid,
        )


def last_request(served: Served):
    """The last request the fake backend received."""
    with served.backend.lock:
        return served.backend.requests[-1]


def openai_error(r: httpx.Response, status: int) -> dict:
    """The response's OpenAI-style error (after checking its status and its four keys)."""
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    return err


def wait_until(cond, what: str, timeout_s: float = 5.0) -> None:
    """Poll cond() until it is true; fail naming `what` after timeout_s."""
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)


def wait_healthy(url: str, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if httpx.get(url + "/health", timeout=2.0).status_code == 200:
            return
        time.sleep(0.02)
    raise AssertionError("frontend did not become healthy")


@contextmanager
def serve(ready: bool = True, api_servers: int = 1, **server_kwargs) -> Iterator[Served]:
    """Frontend 0 of `api_servers`, over the fake backend."""
    tmp = Path(tempfile.mkdtemp(prefix="zsf-", dir="/tmp"))  # ipc paths must stay < 108 bytes
    config = Config(
        server=ServerConfig(**server_kwargs),
        ipc=IPCConfig(run_dir=str(tmp / "run")),
        heartbeat_s=0.2,
        api_servers=api_servers,
    )
    ensure_run_dir(tmp / "run")  # as a component's start does (common.cli.parse_config)
    backend = FakeBackend(config, ready=ready).start()
    app = create_app(config)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(app, lifespan="on", log_level="warning", access_log=False)
    )

    def run_server() -> None:
        with contextlib.suppress(SystemExit):  # uvicorn exits when the lifespan startup fails
            server.run(sockets=[sock])

    thread = threading.Thread(target=run_server, daemon=True)
    thread.start()
    try:
        # (with listen_when_ready, a server whose components are not up yet does not start)
        deadline = time.monotonic() + (
            10 if ready or not server_kwargs.get("listen_when_ready") else 0
        )
        while not server.started and thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.01)
        served = Served(f"http://127.0.0.1:{port}", config, backend, app)
        if ready and server.started:
            wait_healthy(served.url)
        yield served
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        backend.stop()
        sock.close()
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    """One default server shared by a module's tests."""
    with serve() as s:
        yield s


@pytest.fixture
def http(served: Served) -> Iterator[httpx.Client]:
    with served.client() as c:
        yield c
