"""`python launch.py [--tokenize-workers N] [--dp N] [flags]`: every component on one box.

```
 launch.py ─┬─ python -m scheduler_worker --replica-id K   × dp: the engines (each loads
            │                                               the model, has its KV pool;
            │                                               with --tp T it starts T - 1 more
            │                                               ranks of its own)
            ├─ python -m detok_worker
            ├─ python -m tokenizer_worker × N
            └─ python -m frontend --frontend-id I   × api_servers: HTTP on one port
                                             (SO_REUSEPORT); it opens once all are up
```

Each component is its own program, started exactly as a supervisor/systemd deployment
starts it (`python -m <component> --config <file>`), sharing one config file written
into a private run dir (0700) that also holds the IPC sockets. This process only
supervises: it resolves the model once (a GGUF conversion happens here, with its
progress bar, before anything else starts), starts the children, prints the URL once
GET /health answers 200, restarts a child that dies (one dying too often ends the
service, unless it is a replica and another serves: that replica alone is given up), and
on SIGTERM/SIGINT stops the frontend first (it answers 503 to new requests and lets those
in flight finish, up to server.drain_timeout_s), then the workers, and exits 0.
GPU replicas: replica K gets its own GPU(s) through CUDA_VISIBLE_DEVICES in its
environment, set before it starts and kept across its restarts (common/gpus.py).
Children (and a GGUF conversion in progress) get PR_SET_PDEATHSIG (common/process.py), so
a `kill -9` of this process takes them along.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import deque
from dataclasses import dataclass, field, replace
from pathlib import Path

from common.cli import add_config_args, config_from_args
from common.config import Config, ConfigError
from common.cpu import check_kernel_choice
from common.endpoints import ensure_run_dir
from common.env import runtime_dir, shorter_openmp_spins
from common.gpus import plan_gpus, replica_environment
from common.log import get_logger
from common.model_files.model_source import (
    ModelSourceError,
    check_draft_model,
    check_load_format,
    check_quantization_source,
    check_weight_source,
    resolve_model,
)
from common.process import die_with_parent
from common.torch_build import check_device_choice, installed_torch_build

log = get_logger("launch")

STOP_TIMEOUT_S = 10.0  # per group of children, after SIGTERM, before SIGKILL
MAX_RESTARTS = 5  # a component dying this often within RESTART_WINDOW_S is given up on
RESTART_WINDOW_S = 60.0
POLL_S = 0.2


_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback


def check_port_free(host: str, port: int, what: str = "") -> None:
    """Fail before starting anything when a port a child binds is taken (the child would
    otherwise die and be restarted until the launcher gives up)."""
    if port == 0:
        return
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn and zmq bind
        try:
            sock.bind((host, port))
        except OSError as e:
            for_what = f" ({what})" if what else ""
            raise ConfigError(f"cannot listen on {host}:{port}{for_what}: {e.strerror}") from None


def bound_endpoints(config: Config) -> list[tuple[str, str]]:
    """(what, address) of each socket launch.py's children bind: the detok's inbox, each
    replica's, and each frontend's inbox and tokenizer socket (indexed: port + I on tcp)."""
    ipc = config.ipc
    out = [("the detokenizer's inbox", ipc.endpoint("detok"))]
    for k in range(config.data_parallel_size):
        out.append((f"scheduler replica {k}'s inbox", ipc.replica_endpoint(k)))
    for i in range(config.api_servers):
        out.append((f"frontend {i}'s inbox", ipc.frontend_endpoint(i)))
        out.append((f"frontend {i}'s tokenizer socket", ipc.tokenizer_endpoint(i)))
    return out


def check_endpoints_free(config: Config) -> None:
    """The tcp endpoints the children bind: one port each (several frontends and replicas
    take port + I after their set's own: those must not meet another endpoint or the HTTP
    port), each free on this host."""
    taken = {config.server.port: "the HTTP port"} if config.server.port else {}
    for what, address in bound_endpoints(config):
        if not address.startswith("tcp://"):
            continue
        host, _, port_text = address.removeprefix("tcp://").rpartition(":")
        port = int(port_text)
        if port in taken:
            raise ConfigError(f"{what} ({address}) and {taken[port]} both take port {port}")
        taken[port] = f"{what} ({address})"
        host = host.strip("[]")
        check_port_free("0.0.0.0" if host in ("*", "") else host, port, what)


@dataclass
class Child:
    name: str  # "scheduler-0", "detok", "tokenizer-0", ...
    module: str
    args: list[str] = field(default_factory=list)
    proc: subprocess.Popen | None = None
    deaths: deque[float] = field(default_factory=deque)
    gpus: list[str] | None = None  # a GPU replica's: its CUDA_VISIBLE_DEVICES, every start
    given_up: bool = False  # died too often; not restarted (Launcher.reap)


class Launcher:
    def __init__(
        self, config: Config, config_path: Path, gpus: list[list[str]] | None = None
    ) -> None:
        """`gpus`: each replica's GPUs (common.gpus.plan_gpus); None: on the CPU."""
        self.config = config
        self.config_path = config_path
        self.replicas = [
            Child(
                f"scheduler-{k}",
                "scheduler_worker",
                ["--replica-id", str(k)],
                gpus=None if gpus is None else gpus[k],
            )
            for k in range(config.data_parallel_size)
        ]
        self.children: list[Child] = [*self.replicas, Child("detok", "detok_worker")]
        self.children += [
            Child(f"tokenizer-{i}", "tokenizer_worker") for i in range(config.tokenize_workers)
        ]
        self.frontends = [
            Child(f"frontend-{i}", "frontend", ["--frontend-id", str(i)])
            for i in range(config.api_servers)
        ]
        self.children += self.frontends
        self.stopping = False

    # -- children -----------------------------------------------------------------------
    def spawn(self, child: Child) -> None:
        parent = os.getpid()
        child.proc = subprocess.Popen(
            [sys.executable, "-m", child.module, "--config", str(self.config_path), *child.args],
            stdin=subprocess.DEVNULL,
            preexec_fn=lambda: die_with_parent(parent),
            start_new_session=True,  # Ctrl-C reaches launch.py only; it stops them in order
            env=None if child.gpus is None else replica_environment(child.gpus),
        )
        on = "" if child.gpus is None else f" on GPU {','.join(child.gpus)}"
        log.info("started %s (pid %d)%s", child.name, child.proc.pid, on)

    def start(self) -> None:
        for child in self.children:
            self.spawn(child)

    def reap(self) -> bool:
        """Restart children that died. One that dies too often is given up on: a replica
        alone while another serves (its GPU may be the fault), else the whole service
        (False)."""
        for child in self.children:
            if child.given_up or child.proc is None or (code := child.proc.poll()) is None:
                continue
            now = time.monotonic()
            child.deaths.append(now)
            while child.deaths and child.deaths[0] < now - RESTART_WINDOW_S:
                child.deaths.popleft()
            if len(child.deaths) > MAX_RESTARTS:
                others = [c for c in self.replicas if c is not child and not c.given_up]
                alone = child in self.replicas and bool(others)
                log.error(
                    "%s%s died %d times within %.0f s (last exit code %s); giving up%s",
                    child.name,
                    "" if child.gpus is None else f" (GPU {','.join(child.gpus)})",
                    len(child.deaths),
                    RESTART_WINDOW_S,
                    code,
                    " on it: the other replicas serve on" if alone else "",
                )
                if not alone:
                    return False
                child.given_up = True
                continue
            log.error(
                "%s (pid %d) exited with code %s; restarting it", child.name, child.proc.pid, code
            )
            self.spawn(child)
        return True

    def stop(self) -> None:
        """Frontends first (they stop taking requests), then every worker; SIGKILL stragglers."""
        self.stopping = True
        others = [c for c in self.children if c not in self.frontends]
        drain = self.config.server.drain_timeout_s + STOP_TIMEOUT_S
        for group, timeout in ((self.frontends, drain), (others, STOP_TIMEOUT_S)):
            procs = [c.proc for c in group if c.proc is not None and c.proc.poll() is None]
            for p in procs:
                p.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + timeout
            for p in procs:
                try:
                    p.wait(timeout=max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    log.warning("pid %d did not stop in %.0f s; killing it", p.pid, timeout)
                    p.kill()
                    p.wait()

    # -- readiness ----------------------------------------------------------------------
    def healthy(self) -> bool:
        """GET /health answers 200: the frontend is up, every component reported in, and
        all data_parallel_size replicas joined."""
        try:
            with _NO_PROXY.open(self.health_url(), timeout=1.0) as r:
                body = json.loads(r.read())
        except (OSError, ValueError):  # refused, 503 (HTTPError), timeout, not JSON
            return False
        replicas = body.get("components", {}).get("scheduler", {}).get("replicas", {})
        alive = sum(1 for r in replicas.values() if r.get("alive"))
        return alive >= self.config.data_parallel_size

    def health_url(self) -> str:
        host = self.config.server.host
        if host in ("0.0.0.0", "", "::"):
            host = "127.0.0.1" if host != "::" else "::1"
        if ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{self.config.server.port}/health"

    def wait_ready(self) -> bool:
        deadline = time.monotonic() + self.config.server.startup_timeout_s + 30
        while not self.stopping and time.monotonic() < deadline:
            for child in self.children:
                if child.proc is not None and child.proc.poll() is not None:
                    log.error(
                        "%s exited with code %s during startup", child.name, child.proc.returncode
                    )
                    return False
            if self.healthy():
                return True
            time.sleep(POLL_S)
        return False

    def supervise(self) -> int:
        while not self.stopping:
            if not self.reap():
                return 1
            time.sleep(POLL_S)
        return 0


def auto_api_servers() -> int:
    """Frontend processes on a GPU when none are asked for: the GPU's engine steps
    outrun one frontend's core (docs/benchmarks.md); one for every 4 cores, at most 4."""
    return max(1, min(4, len(os.sched_getaffinity(0)) // 4))


def build_config(argv: list[str] | None) -> tuple[Config, bool]:
    parser = argparse.ArgumentParser(
        description="zeroserve: start the frontend, tokenizer pool, scheduler and detokenizer"
    )
    add_config_args(parser)
    args = parser.parse_args(argv)
    config = config_from_args(args)
    gpu = config.engine.model.device == "cuda"
    if gpu and args.api_servers is None and config.api_servers == 1:  # not asked for
        config = replace(config, api_servers=auto_api_servers())
    if config.api_servers > 1 and config.server.port == 0:
        raise ConfigError("--api-servers above 1 needs a fixed --port: they share it")
    if not config.ipc.secret:  # sign request ids (common.auth) with a fresh key per launch
        config = replace(config, ipc=replace(config.ipc, secret=secrets.token_hex(32)))
    # the port opens once every component is up: "port open" means ready here
    config = replace(config, server=replace(config.server, listen_when_ready=True))
    n, mc = config.data_parallel_size, config.engine.model
    ranks = n * mc.tensor_parallel_size  # scheduler processes: each replica's ranks
    if ranks > 1 and mc.num_threads is None:  # they must not oversubscribe the cores
        threads = max(1, len(os.sched_getaffinity(0)) // ranks)
        config = replace(
            config, engine=replace(config.engine, model=replace(mc, num_threads=threads))
        )
    own_run_dir = config.ipc.run_dir is None
    if own_run_dir:  # a fresh private dir per launch: two servers never share sockets
        run_dir = tempfile.mkdtemp(prefix="zeroserve-", dir=runtime_dir())  # mode 0700
        config = replace(config, ipc=replace(config.ipc, run_dir=run_dir))
    return config, own_run_dir


class _Interrupted(BaseException):  # like KeyboardInterrupt: no `except Exception` eats it
    pass


def _interrupt(signum: int, _frame) -> None:
    raise _Interrupted(signal.Signals(signum).name)


def main(argv: list[str] | None = None) -> int:
    started = time.monotonic()
    # until the children start, SIGTERM/SIGINT end a model conversion or port check cleanly
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, _interrupt)
    try:
        config, own_run_dir = build_config(argv)
    except ConfigError as e:
        print(f"launch.py: {e}", file=sys.stderr)
        return 2
    except _Interrupted:
        return 0
    assert config.ipc.run_dir is not None  # build_config sets one
    run_dir = Path(config.ipc.run_dir)
    try:
        mc = config.engine.model
        gpus = plan_gpus(config, installed_torch_build())  # too few GPUs: refused first
        check_device_choice(mc.device)  # a CPU build of torch and --device cuda
        check_port_free(config.server.host, config.server.port)
        check_endpoints_free(config)
        check_load_format(mc.load_format, mc.model)  # before any conversion
        model_dir = resolve_model(mc.model, mc.resolved_cache_dir)
        check_weight_source(mc.load_format, model_dir)  # before any child starts
        log.info("model %s ready at %s", mc.model, model_dir)
        check_quantization_source(mc.quantization, model_dir)
        check_draft_model(config.engine, model_dir)  # --speculative-model: the same tokenizer
        check_kernel_choice(mc.kernels)
        ensure_run_dir(run_dir)  # --run-dir: made (0700) if missing, checked private
        config_path = run_dir / "config.json"
        config.save(config_path)
        shorter_openmp_spins()  # the children's torch threads idle off the CPU (common/env.py)
        launcher = Launcher(config, config_path, gpus)

        def on_signal(signum: int, _frame) -> None:
            if not launcher.stopping:
                log.info("%s: shutting down", signal.Signals(signum).name)
            launcher.stopping = True

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        launcher.start()
        code = 0
        if launcher.wait_ready():
            url = f"http://{config.server.host}:{config.server.port}"
            took = time.monotonic() - started  # model conversion and kernel build included
            log.info(
                "zeroserve ready: %s  (OpenAI base URL %s/v1, model %s, %d scheduler "
                "replica(s), %d tokenizer worker(s), started in %.1fs)",
                url,
                url,
                config.model_name,
                config.data_parallel_size,
                config.tokenize_workers,
                took,
            )
            print(f"zeroserve ready: {url}/v1 (started in {took:.1f}s)", flush=True)
            code = launcher.supervise()
        elif not launcher.stopping:
            log.error("startup failed")
            code = 1
        launcher.stop()
        log.info("stopped")
        return code
    except (ModelSourceError, ConfigError, PermissionError) as e:  # (a run dir not ours)
        print(f"launch.py: {e}", file=sys.stderr)
        return 2
    except _Interrupted as e:  # asked to stop before anything was started: nothing to drain
        log.info("%s before startup finished: stopped", e)
        return 0
    finally:
        if own_run_dir:
            shutil.rmtree(run_dir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
