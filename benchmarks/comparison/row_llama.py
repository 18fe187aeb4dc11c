"""Row (e): llama.cpp's llama-server on the same GGUF, when a binary is found."""

from __future__ import annotations

import argparse
import math
import os
import shlex
import shutil
import time
from pathlib import Path
from typing import Any

from benchmarks.comparison.process import Process, _log_dir, _row_failed, free_port
from benchmarks.comparison.server_runs import serving_runs
from benchmarks.comparison.util import log
from benchmarks.comparison.workload import Workload


def find_llama_server(args: argparse.Namespace) -> tuple[str | None, str]:
    """(path, "") or (None, why it is skipped)."""
    if args.llama_server:
        p = Path(args.llama_server).expanduser()
        if p.is_file() and os.access(p, os.X_OK):
            return str(p.resolve()), ""
        found = shutil.which(args.llama_server)
        if found:
            return found, ""
        return None, f"--llama-server {args.llama_server}: not an executable file"
    found = shutil.which("llama-server")
    if found:
        return found, ""
    return None, "llama-server not on PATH and no --llama-server PATH given"


def gguf_for(args: argparse.Namespace) -> tuple[Path | None, str]:
    from common.model_files.model_source import (
        DEFAULT_MODEL_ALIAS,
        ModelSourceError,
        default_gguf_path,
    )

    if args.gguf:
        return Path(args.gguf).expanduser(), ""
    if args.model == DEFAULT_MODEL_ALIAS:
        try:
            return default_gguf_path(), ""
        except ModelSourceError as e:
            return None, str(e)
    p = Path(args.model).expanduser()
    if p.is_file():
        return p, ""
    return None, f"--model {args.model} is not a GGUF file; pass --gguf FILE"


def llama_ctx_per_slot(args: argparse.Namespace, w: Workload) -> int:
    if args.llama_ctx_per_slot:
        return args.llama_ctx_per_slot
    longest = max(len(x) for x in [w.warmup_ids, *w.main_ids, *w.single_ids])
    need = longest + max(w.output_len, w.single_output_len, 16) + 64  # BOS, template slack
    return 256 * math.ceil(need / 256)


def llama_threads(args: argparse.Namespace) -> int:
    if args.llama_threads:
        return args.llama_threads
    import torch

    return torch.get_num_threads()  # what our engine (torch's default) uses


def row_llama(
    args: argparse.Namespace,
    w: Workload,
    binary: str,
    gguf: Path,
    tmp: Path,
    model_dir: Path,
    tag: str,
) -> dict[str, Any]:
    port = free_port()
    ctx = llama_ctx_per_slot(args, w)
    threads = llama_threads(args)
    argv = [
        binary,
        "-m",
        str(gguf),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "-np",
        str(args.concurrency),
        "-c",
        str(args.concurrency * ctx),
        "-t",
        str(threads),
        *shlex.split(args.llama_args),
    ]
    log_path = _log_dir(args, tmp) / f"{tag}-llama-server.log"
    log(f"starting {shlex.join(argv)} (log {log_path})")
    proc = Process(argv, log_path, f"http://127.0.0.1:{port}")
    row: dict[str, Any] = {
        "command": argv,
        "log": str(log_path) if args.log_dir else None,
        "gguf": str(gguf),
        "ctx_per_slot": ctx,
        "threads": threads,
    }
    try:
        t0 = time.perf_counter()
        proc.wait_healthy(args.startup_timeout)
        row["startup_s"] = time.perf_counter() - t0
        row.update(serving_runs(args, w, proc, tmp, "llama-server", model_dir, False))
        row["model"] = row["main_full"]["config"]["model"]
        row["forward_share"] = None
    except Exception as e:
        raise _row_failed(e, row, proc) from e
    finally:
        row["exit_code"] = proc.stop()
    return row
