"""Several frontend processes on one HTTP port (config.api_servers, vLLM's
--api-server-count): what they share, and how they share the port.

```
 clients ──TCP──▶ port P (SO_REUSEPORT: the kernel spreads connections)
                   ├─ frontend 0  inbox "frontend",   ROUTER "tokenizer"
                   ├─ frontend 1  inbox "frontend.1", ROUTER "tokenizer.1"
                   └─ ...
 workers ──▶ FrontendLinks: a request's outputs, errors, replies to the frontend that
             accepted it (its `frontend` id); statuses to every one
 <run dir>/frontends/   prometheus/  per-request metrics, one file set per process
                        responses.sqlite3  the /v1/responses store
                        stats.I.json  frontend I's own /stats figures (PeerStats)
```

One frontend is a plain uvicorn server bound by uvicorn, its metrics and /v1/responses
store in memory. With more, each process binds the port itself with SO_REUSEPORT (bound
when it starts, listening only once uvicorn's startup is done, so with
server.listen_when_ready a connection still reaches only a frontend that is ready); the
per-request metrics are prometheus_client's multiprocess files, summed by whichever
frontend a scrape reaches; stored responses live in one SQLite file, so a
`previous_response_id` is found whichever frontend the next call reaches; /stats adds
the other frontends' in-flight counts and output tokens (PeerStats). The replicas'
figures need no sharing: every frontend receives every status. Each frontend admits
ceil(server.max_queued_requests / N) sub-requests in flight.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import time
from pathlib import Path
from typing import TYPE_CHECKING

from common.config import Config
from common.endpoints import default_run_dir, ensure_run_dir

if TYPE_CHECKING:  # (prometheus_client must not be imported before prepare_metrics)
    from frontend.metrics import Metrics

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"  # prometheus_client's: read at its import
PEER_STALE_S = 3.0  # a frontend's /stats figures older than this: it is gone, not counted
_LIVE_GAUGE_FILE = re.compile(r"^gauge_live\w*_(\d+)\.db$")


def shared_dir(config: Config) -> Path | None:
    """<run dir>/frontends, made private (0700) if missing; None with one frontend."""
    if config.api_servers == 1:
        return None
    run_dir = config.ipc.resolved_run_dir or default_run_dir()
    return ensure_run_dir(Path(run_dir) / "frontends")


def metrics_dir(config: Config) -> Path | None:
    """Where the frontends' per-request metrics files live; None with one frontend."""
    shared = shared_dir(config)
    return None if shared is None else ensure_run_dir(shared / "prometheus")


def responses_db(config: Config) -> Path | None:
    """The shared /v1/responses store's file; None (in memory) with one frontend."""
    shared = shared_dir(config)
    return None if shared is None else shared / "responses.sqlite3"


def prepare_metrics(config: Config) -> Path | None:
    """Before prometheus_client is imported: with several frontends, point it at the
    shared metrics dir (its multiprocess mode), and retire the live-summed gauges of
    frontends that died (a restarted one's predecessor), which would count forever."""
    path = metrics_dir(config)
    if path is None:
        return None
    os.environ[MULTIPROC_ENV] = str(path)
    from prometheus_client import multiprocess

    for name in os.listdir(path):
        m = _LIVE_GAUGE_FILE.match(name)
        if m is not None and not _alive(int(m.group(1))):
            multiprocess.mark_process_dead(int(m.group(1)), str(path))
    return path


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process holds that pid now
        return True
    return True


def shared_port_socket(host: str, port: int) -> socket.socket:
    """The HTTP port for one of several frontends: SO_REUSEPORT, bound, not listening yet
    (asyncio's create_server listens once uvicorn's startup is done)."""
    if port == 0:
        raise ValueError("several frontends (api_servers > 1) need a fixed port, not 0")
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        if family == socket.AF_INET6:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind(address)
    except BaseException:
        sock.close()
        raise
    return sock


def own_figures(num_open: dict[int, int], metrics: Metrics, now: float) -> dict[int, list[float]]:
    """{replica: [sub-requests in flight, output tokens so far, per s]}: one frontend's
    alone (EngineClient.num_open, frontend.metrics.Metrics), the /stats figures that
    several frontends add up."""
    replicas = set(num_open) | set(metrics.replica_tokens)
    return {
        k: [
            num_open.get(k, 0),
            metrics.replica_tokens_total.get(k, 0),
            metrics.replica_tokens[k].rate(now) if k in metrics.replica_tokens else 0.0,
        ]
        for k in replicas
    }


class PeerStats:
    """The per-replica figures of /stats that each frontend holds alone (sub-requests in
    flight, output tokens so far and per second), shared through one small file per
    frontend (stats.I.json, replaced whole): each publishes its own from its watchdog,
    /stats adds those of the others that are fresh (PEER_STALE_S)."""

    def __init__(self, config: Config) -> None:
        shared = shared_dir(config)
        assert shared is not None, "PeerStats is for several frontends"
        self.dir = shared
        self.me = config.frontend_id
        self.path = shared / f"stats.{self.me}.json"

    def publish(self, figures: dict[int, list[float]]) -> None:
        """This frontend's {replica: [in flight, tokens total, tokens per s]}."""
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"time": time.time(), "replicas": figures}))
        os.replace(tmp, self.path)

    def others(self) -> dict[int, list[float]]:
        """The other live frontends' figures, summed per replica."""
        out: dict[int, list[float]] = {}
        now = time.time()
        for path in self.dir.glob("stats.*.json"):
            if path == self.path:
                continue
            try:
                data = json.loads(path.read_text())
                if now - float(data["time"]) > PEER_STALE_S:
                    continue
                for k, values in data["replicas"].items():
                    row = out.setdefault(int(k), [0.0, 0.0, 0.0])
                    for i, v in enumerate(values[:3]):
                        row[i] += float(v)
            except (OSError, ValueError, KeyError, TypeError, AttributeError):
                continue  # being replaced, or not ours: skip it this time
        return out
