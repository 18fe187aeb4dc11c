"""Data parallelism across hosts: every component on its own loopback address over tcp,
and one replica in its own network namespace, where the test may make one."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import pytest

from tests.e2e.conftest import REPO
from tests.e2e.test_data_parallel import replicas
from tests.frontend.sse import parse_sse

pytestmark = pytest.mark.timeout(300)


# -- multi-host: every component on its own address, tcp only -------------------------------


def free_port(host: str) -> int:
    """A free port on `host`; on an address of another network namespace (not bindable
    here), a random high port."""
    with socket.socket() as s:
        try:
            s.bind((host, 0))
        except OSError:
            return random.randrange(30000, 60000)
        return s.getsockname()[1]


def run_topology(hub: str, replica_hosts: list[str], prefixes: list[tuple[str, ...]]) -> None:
    """Frontend, tokenizer and detok on `hub` addresses, replica K on replica_hosts[K]
    (started with prefixes[K], e.g. `ip netns exec NS`); a stream to each replica."""
    tmp = Path(tempfile.mkdtemp(prefix="zs-tcp-", dir="/tmp"))
    http_host = hub
    port = free_port(http_host)
    ipc = {
        "tokenizer": f"tcp://{hub}:{free_port(hub)}",
        "frontend": f"tcp://{hub}:{free_port(hub)}",
        "detok": f"tcp://{hub}:{free_port(hub)}",
        "scheduler": f"tcp://{replica_hosts[0]}:{free_port(replica_hosts[0])}",
        "secret": "shared-secret-" + os.urandom(8).hex(),
    }
    config = tmp / "config.json"
    config.write_text(
        json.dumps(
            {
                "server": {"host": http_host, "port": port},
                "ipc": ipc,
                "engine": {
                    "model": {"dtype": "float32", "quantization": "none"},
                    "cache": {"num_blocks": 1024},
                },
            }
        )
    )
    log = (tmp / "log").open("w")  # closed in the finally below
    procs: list[subprocess.Popen] = []

    def start(*args: str) -> None:
        procs.append(
            subprocess.Popen(
                [*args], cwd=REPO, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        )

    try:
        for module in ("frontend", "tokenizer_worker", "detok_worker"):
            start(sys.executable, "-m", module, "--config", str(config))
        for k, (host, prefix) in enumerate(zip(replica_hosts, prefixes)):
            # replica 0 binds the config's scheduler address, the others their own
            inbox = [] if k == 0 else ["--replica-inbox", f"tcp://{host}:{free_port(host)}"]
            args = ["--config", str(config), "--replica-id", str(k), "--threads", "1", *inbox]
            start(*prefix, sys.executable, "-m", "scheduler_worker", *args)
        url = f"http://{http_host}:{port}"
        deadline = time.monotonic() + 120
        while True:
            try:
                alive = [r["alive"] for r in replicas(url).values()]
                if alive.count(True) == len(replica_hosts):
                    break
            except (httpx.HTTPError, ValueError, KeyError):
                pass
            assert all(p.poll() is None for p in procs), (tmp / "log").read_text()[-3000:]
            assert time.monotonic() < deadline, (tmp / "log").read_text()[-3000:]
            time.sleep(0.3)
        table = replicas(url)
        for k, host in enumerate(replica_hosts):
            assert table[str(k)]["inbox"].startswith(f"tcp://{host}:"), table
            body = {
                "prompt": "Over the wire:",
                "max_tokens": 6,
                "ignore_eos": True,
                "stream": True,
                "stop": ["zzzz"],
                "data_parallel_rank": k,
            }
            r = httpx.post(url + "/v1/completions", json=body, timeout=60)
            *events, done = parse_sse(r.text)
            assert r.status_code == 200 and done == "[DONE]", r.text
            assert events[-1]["choices"][0]["finish_reason"] == "length"
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            assert p.wait(timeout=60) == 0, (tmp / "log").read_text()[-3000:]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        log.close()
        shutil.rmtree(tmp, ignore_errors=True)


def test_tcp_topology_on_loopback_addresses(default_model_dir):
    """Frontend + tokenizer + detok on 127.0.0.2, the replicas on 127.0.0.3 and .4."""
    run_topology("127.0.0.2", ["127.0.0.3", "127.0.0.4"], [(), ()])


def _netns_unavailable() -> str | None:
    if os.geteuid() != 0:
        return "needs root to create a network namespace"
    if shutil.which("ip") is None:
        return "needs the ip command (iproute2)"
    probe = f"zsprobe{os.getpid()}"
    r = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if r.returncode != 0:
        return f"cannot create a network namespace here: {r.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def test_a_replica_in_its_own_network_namespace():
    """Replica 1 runs in a network namespace joined to this one by a veth pair: it reaches
    the frontend and detok, and they reach it, only over that link."""
    why = _netns_unavailable()
    if why:
        pytest.skip(why)
    ns, host_if, ns_if = f"zs{os.getpid()}", f"zsa{os.getpid()}", f"zsb{os.getpid()}"
    net = f"10.{200 + os.getpid() % 50}.{os.getpid() % 250}"
    setup = [
        ["ip", "netns", "add", ns],
        ["ip", "link", "add", host_if, "type", "veth", "peer", "name", ns_if],
        ["ip", "link", "set", ns_if, "netns", ns],
        ["ip", "addr", "add", f"{net}.1/24", "dev", host_if],
        ["ip", "link", "set", host_if, "up"],
        ["ip", "netns", "exec", ns, "ip", "addr", "add", f"{net}.2/24", "dev", ns_if],
        ["ip", "netns", "exec", ns, "ip", "link", "set", ns_if, "up"],
        ["ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up"],
    ]
    try:
        for cmd in setup:
            subprocess.run(cmd, check=True, capture_output=True)
        run_topology(f"{net}.1", [f"{net}.1", f"{net}.2"], [(), ("ip", "netns", "exec", ns)])
    finally:
        subprocess.run(["ip", "link", "del", host_if], capture_output=True)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)
