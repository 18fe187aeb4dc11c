"""frontend/frontends.py, the pieces several frontends on one port share: the port itself
(SO_REUSEPORT, not listening until asked), /stats' per-frontend figures (PeerStats), and
the metrics dir (a dead frontend's live-summed gauges retired)."""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import subprocess
import sys

import pytest

from common.config import Config, IPCConfig
from frontend.frontends import (
    PEER_STALE_S,
    PeerStats,
    metrics_dir,
    prepare_metrics,
    responses_db,
    shared_dir,
    shared_port_socket,
)


def config_of(run_dir, frontend: int = 0, n: int = 2) -> Config:
    return Config(ipc=IPCConfig(run_dir=str(run_dir)), api_servers=n, frontend_id=frontend)


def test_one_frontend_shares_nothing(run_dir):
    c = config_of(run_dir, n=1)
    assert shared_dir(c) is None and metrics_dir(c) is None and responses_db(c) is None
    assert not (run_dir / "frontends").exists()


def test_the_port_is_shared_and_listens_only_when_asked():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    a, b = shared_port_socket("127.0.0.1", port), shared_port_socket("127.0.0.1", port)
    try:
        with socket.socket() as client, pytest.raises(ConnectionRefusedError):
            client.connect(("127.0.0.1", port))  # bound, not listening: refused
        a.listen()
        with socket.socket() as client:
            client.connect(("127.0.0.1", port))
    finally:
        a.close()
        b.close()
    with pytest.raises(ValueError, match="fixed port"):
        shared_port_socket("127.0.0.1", 0)


def test_peer_stats_add_the_other_live_frontends(run_dir):
    me, other, gone = (PeerStats(config_of(run_dir, i, 3)) for i in range(3))
    me.publish({0: [1, 10, 2.0]})
    other.publish({0: [2, 30, 5.0], 1: [1, 4, 1.0]})
    gone.publish({0: [7, 70, 7.0]})
    data = json.loads(gone.path.read_text())
    data["time"] -= PEER_STALE_S + 1  # its last word is too old: it died
    gone.path.write_text(json.dumps(data))
    (run_dir / "frontends" / "stats.9.json").write_text("{not json")
    assert me.others() == {0: [2.0, 30.0, 5.0], 1: [1.0, 4.0, 1.0]}
    assert other.others() == {0: [1.0, 10.0, 2.0]}


def test_a_dead_frontends_live_gauges_are_retired(run_dir):
    c = config_of(run_dir)
    path = metrics_dir(c)
    assert path is not None and (os.stat(path).st_mode & 0o777) == 0o700
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    live = os.getpid()
    for pid in (dead.pid, live):
        (path / f"gauge_livesum_{pid}.db").write_bytes(b"")
    (path / f"counter_{dead.pid}.db").write_bytes(b"")  # counters stay: totals keep counting
    env = dict(os.environ)
    try:
        assert prepare_metrics(c) == path
        assert os.environ["PROMETHEUS_MULTIPROC_DIR"] == str(path)
    finally:
        os.environ.clear()
        os.environ.update(env)
    assert sorted(os.listdir(path)) == sorted(
        [f"gauge_livesum_{live}.db", f"counter_{dead.pid}.db"]
    )


def test_frontend_id_must_be_one_of_the_api_servers(run_dir):
    from common.config import ConfigError

    with pytest.raises(ConfigError, match="frontend_id 2 is out of range"):
        config_of(run_dir, 2, 2)
    with pytest.raises(ConfigError, match="api_servers"):
        dataclasses.replace(config_of(run_dir), api_servers=0)
    assert config_of(run_dir, 1, 2).ipc.frontend_endpoint(1).endswith("/frontend.1.sock")
