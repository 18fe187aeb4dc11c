"""Rows (b, c): our server, `launch.py --tokenize-workers W`, as a subprocess on a free
loopback port with a private run dir."""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.comparison.engine_args import engine_flags
from benchmarks.comparison.process import REPO, Process, _log_dir, _row_failed, free_port
from benchmarks.comparison.row_offline import PairedPrefill
from benchmarks.comparison.server_runs import serving_runs
from benchmarks.comparison.util import log
from benchmarks.comparison.workload import Workload


def row_server(
    args: argparse.Namespace,
    w: Workload,
    workers: int,
    tmp: Path,
    model_dir: Path,
    tag: str,
    paired: PairedPrefill | None,
) -> dict[str, Any]:
    port = free_port()
    run_dir = Path(tempfile.mkdtemp(prefix="zs-cmp-", dir="/tmp"))  # short: ipc paths
    argv = [
        sys.executable,
        str(REPO / "launch.py"),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--tokenize-workers",
        str(workers),
        "--run-dir",
        str(run_dir),
        *engine_flags(args),
    ]
    log_path = _log_dir(args, tmp) / f"{tag}-server-w{workers}.log"
    log(f"starting {shlex.join(argv[1:])} (log {log_path})")
    proc = Process(
        argv, log_path, f"http://127.0.0.1:{port}", env={**os.environ, "PYTHONUNBUFFERED": "1"}
    )
    row: dict[str, Any] = {"command": argv, "log": str(log_path) if args.log_dir else None}
    try:
        t0 = time.perf_counter()
        proc.wait_healthy(args.startup_timeout)
        row["startup_s"] = time.perf_counter() - t0
        row.update(serving_runs(args, w, proc, tmp, f"server-w{workers}", model_dir, True, paired))
    except Exception as e:
        raise _row_failed(e, row, proc) from e
    finally:
        row["exit_code"] = proc.stop()
        shutil.rmtree(run_dir, ignore_errors=True)
    if row["exit_code"] != 0:
        row.setdefault("warnings", []).append(f"exit code {row['exit_code']} after SIGTERM")
    return row
