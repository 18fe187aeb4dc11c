"""A server under test (ours or llama-server) as a subprocess: started with its log
file, waited on until healthy and until idle, its /metrics read, stopped; and the error
of a row whose server failed, with the log tail."""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

from benchmarks.comparison.metrics import parse_metrics

REPO = Path(__file__).resolve().parents[2]
HEARTBEAT_WAIT_S = 1.5  # the scheduler reports its counters every heartbeat (1 s)
LOG_TAIL = 3000
PR_SET_PDEATHSIG = 1


def cpu_seconds(pid: int) -> float | None:
    """utime + stime of one process, in seconds (from /proc); None once it is gone."""
    try:
        f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


def child_processes(root: int) -> dict[str, int]:
    """The children of pid `root` (launch.py's: its components), each named by its
    `python -m` module, else its script's stem; a second of one name as `<name>.<pid>`."""
    found: dict[str, int] = {}
    for e in Path("/proc").iterdir():
        if not e.name.isdigit():
            continue
        try:
            ppid = int((e / "stat").read_text().rsplit(")", 1)[1].split()[1])
            argv = (e / "cmdline").read_bytes().split(b"\0")
        except (OSError, ValueError, IndexError):
            continue
        if ppid != root:
            continue
        name = (
            argv[argv.index(b"-m") + 1].decode()
            if b"-m" in argv[:-1]
            else Path(argv[1].decode() if len(argv) > 1 else "?").stem
        )
        found[name if name not in found else f"{name}.{e.name}"] = int(e.name)
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent(parent_pid: int) -> None:  # child, between fork and exec
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent_pid:
        os._exit(1)


class Process:
    """A server subprocess (ours or llama-server) with its log file."""

    def __init__(
        self, argv: list[str], log_path: Path, base_url: str, env: dict[str, str] | None = None
    ) -> None:
        self.argv, self.log_path, self.base_url = argv, log_path, base_url
        parent = os.getpid()
        with open(log_path, "wb") as f:
            self.proc = subprocess.Popen(
                argv,
                cwd=REPO,
                stdout=f,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                preexec_fn=lambda: _die_with_parent(parent),
            )

    def log_tail(self, n: int = LOG_TAIL) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def wait_healthy(self, timeout_s: float) -> None:
        import httpx

        deadline = time.monotonic() + timeout_s
        last = "no answer"
        # one client for every poll: httpx.get makes a client (an SSL context) each call,
        # ~28 ms of CPU, 5 times a second, taken from the start-up being measured
        with httpx.Client(timeout=2) as client:
            while True:
                if self.proc.poll() is not None:
                    raise RuntimeError(
                        f"exited with code {self.proc.returncode} before /health "
                        f"answered 200; log tail:\n{self.log_tail()}"
                    )
                try:
                    r = client.get(self.base_url + "/health")
                    if r.status_code == 200:
                        return
                    last = f"HTTP {r.status_code}"
                except httpx.HTTPError as e:
                    last = type(e).__name__
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"/health not 200 after {timeout_s:.0f} s ({last}); log "
                        f"tail:\n{self.log_tail()}"
                    )
                time.sleep(0.2)

    def stop(self, timeout_s: float = 60.0) -> int | None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            return None

    def metrics(self) -> dict[str, float]:
        import httpx

        return parse_metrics(httpx.get(self.base_url + "/metrics", timeout=10).text)


def wait_idle(server: Process, timeout_s: float = 60.0) -> dict[str, float]:
    """Metrics once the scheduler has reported an idle engine after the last activity,
    and its busy counters held still over a further heartbeat. They ride on the
    heartbeat, which an idle scheduler sends within ~1 s of its last step, later on a
    loaded machine: a reading one wait after the run could still hold the counters from
    before it (a run with no busy time at all)."""
    time.sleep(HEARTBEAT_WAIT_S)
    deadline = time.monotonic() + timeout_s
    last: float | None = None
    while True:
        m = server.metrics()
        idle = all(
            m.get(f"zeroserve:num_requests_{k}", 0) == 0
            for k in ("running", "waiting", "in_flight")
        )
        # every part summed (parse_metrics); an idle loop still adds microseconds (its
        # wake-ups), so still means under 1 ms
        busy = m.get("zeroserve:scheduler_busy_seconds_total", 0.0)
        if idle and last is not None and abs(busy - last) < 1e-3:
            return m
        if time.monotonic() > deadline:
            raise RuntimeError(f"server not idle after {timeout_s:.0f} s")
        last = busy if idle else None
        time.sleep(HEARTBEAT_WAIT_S if idle else 0.2)


class RowError(RuntimeError):
    """A row that failed after it had figures worth keeping (command, log tail...)."""

    def __init__(self, message: str, extra: dict[str, Any]) -> None:
        super().__init__(message)
        self.extra = extra


def _row_failed(e: Exception, row: dict[str, Any], proc: Process) -> RowError:
    row["log_tail"] = proc.log_tail()
    return RowError(f"{type(e).__name__}: {e}", row)


def _log_dir(args: argparse.Namespace, tmp: Path) -> Path:
    d = Path(args.log_dir) if args.log_dir else tmp
    d.mkdir(parents=True, exist_ok=True)
    return d
