"""Our server as a benchmark subprocess: `launch.py` on a free loopback port with a
private run dir, its start-up time, and the resident memory of its scheduler processes."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.comparison.process import REPO, Process, free_port

_STARTED = re.compile(r"started in ([0-9.]+) ?s")


@dataclass
class Zeroserve:
    """`launch.py --model MODEL [flags]`, started by `start()`, stopped by `stop()`."""

    model: str
    flags: list[str]
    log_path: Path
    proc: Process | None = None
    run_dir: Path | None = None
    startup_s: float | None = None  # spawn -> /health 200, measured here
    argv: list[str] = field(default_factory=list)

    def start(self, timeout_s: float) -> None:
        port = free_port()
        self.run_dir = Path(tempfile.mkdtemp(prefix="zs-bench-", dir="/tmp"))  # short: ipc
        self.argv = [
            sys.executable,
            str(REPO / "launch.py"),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--run-dir",
            str(self.run_dir),
            "--model",
            self.model,
            *self.flags,
        ]
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        t0 = time.perf_counter()
        self.proc = Process(self.argv, self.log_path, f"http://127.0.0.1:{port}", env=env)
        self.proc.wait_healthy(timeout_s)
        self.startup_s = time.perf_counter() - t0

    @property
    def command(self) -> str:
        return shlex.join(self.argv[1:])

    def launch_reported_startup_s(self) -> float | None:
        """What launch.py printed: `zeroserve ready: ... (started in N s)`."""
        m = _STARTED.search(self.proc.log_tail(200_000) if self.proc else "")
        return float(m.group(1)) if m else None

    def scheduler_memory(self) -> dict[str, Any]:
        """VmRSS and VmHWM (peak) of each scheduler process, in bytes."""
        if self.proc is None:
            return {}
        return {
            str(pid): proc_memory(pid)
            for pid in child_pids(self.proc.proc.pid)
            if "scheduler_worker" in cmdline(pid)
        }

    def stop(self) -> int | None:
        code = self.proc.stop() if self.proc else None
        if self.run_dir:
            shutil.rmtree(self.run_dir, ignore_errors=True)
        return code


def child_pids(parent: int) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        # pid (comm) state ppid ...: comm may hold spaces and parentheses
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) > 1 and int(fields[1]) == parent:
            out.append(int(d.name))
    return out


def tree_pids(parent: int) -> list[int]:
    """parent and its children (launch.py's are the scheduler, frontend, detok, tokenizers)."""
    return [parent, *child_pids(parent)]


def proc_cpu_s(pids: list[int]) -> float:
    """User + system CPU seconds the processes have used so far (those gone count 0)."""
    total = 0
    for pid in pids:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime in clock ticks
    return total / os.sysconf("SC_CLK_TCK")


def process_role(pid: int) -> str:
    """What a measured process is: the module a launch.py child runs (`python -m
    scheduler_worker ...`: scheduler_worker, frontend, detok_worker, tokenizer_worker),
    "launch" for launch.py, a script's name for another Python program, else its
    program's name (llama-server, whose own `-m` is its model)."""
    args = cmdline(pid).split()
    if not args:
        return "?"
    if not os.path.basename(args[0]).startswith("python"):
        return os.path.basename(args[0])
    rest = args[1:]
    while rest and rest[0].startswith("-") and rest[0] != "-m":  # the interpreter's options
        rest = rest[1:]
    if len(rest) > 1 and rest[0] == "-m":
        return rest[1]
    if rest and rest[0].endswith("launch.py"):
        return "launch"
    return os.path.basename(rest[0]) if rest else "python"


def proc_cpu_by_role(pids: list[int]) -> dict[str, float]:
    """proc_cpu_s of the processes, summed by process_role (a role's several processes,
    the tokenizer workers, as one)."""
    out: dict[str, float] = {}
    for pid in pids:
        role = process_role(pid)
        out[role] = out.get(role, 0.0) + proc_cpu_s([pid])
    return out


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def proc_memory(pid: int) -> dict[str, int | None]:
    """{"rss": VmRSS, "peak_rss": VmHWM} in bytes (None where unreadable)."""
    out: dict[str, int | None] = {"rss": None, "peak_rss": None}
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return out
    for key, name in (("VmRSS", "rss"), ("VmHWM", "peak_rss")):
        m = re.search(rf"^{key}:\s+(\d+) kB", text, re.M)
        if m:
            out[name] = int(m.group(1)) * 1024
    return out
