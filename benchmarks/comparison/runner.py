"""The comparison: every row in turn on one workload (a failed row is kept as its
error, the others go on), the CPUs' busy share around it, and the result dict."""

from __future__ import annotations

import argparse
import gc
import shutil
import subprocess
import tempfile
import time
import traceback
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchmarks.comparison.checks import evaluate_checks
from benchmarks.comparison.process import LOG_TAIL, REPO, RowError
from benchmarks.comparison.row_hf import row_hf
from benchmarks.comparison.row_llama import find_llama_server, gguf_for, row_llama
from benchmarks.comparison.row_offline import PairedPrefill, row_offline
from benchmarks.comparison.row_server import row_server
from benchmarks.comparison.util import log
from benchmarks.comparison.workload import Workload


def cpu_busy(interval_s: float = 1.0) -> float | None:
    """Fraction of all CPUs busy over interval_s (/proc/stat); None where unreadable."""

    def sample() -> tuple[int, int]:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        return sum(v), v[3] + (v[4] if len(v) > 4 else 0)  # total, idle + iowait

    try:
        t0, i0 = sample()
        time.sleep(interval_s)
        t1, i1 = sample()
    except (OSError, ValueError, IndexError):
        return None
    return 1.0 - (i1 - i0) / (t1 - t0) if t1 > t0 else None


def _empty_cuda_cache() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def run_row(key: str, label: str, name: str, fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """A row's figures, or its error: one row failing never stops the others."""
    log(f"({label}) {name}")
    t0 = time.perf_counter()
    try:
        row = {"key": key, "label": label, "name": name, "status": "ok", **fn()}
    except Exception as e:  # any failure becomes the row's error, the others go on
        tb = traceback.format_exc()
        msg = str(e) if isinstance(e, RowError) else f"{type(e).__name__}: {e}"
        log(f"({label}) {name}: error: {msg}")
        row = {
            **getattr(e, "extra", {}),
            "key": key,
            "label": label,
            "name": name,
            "status": "error",
            "error": msg,
            "traceback": tb[-LOG_TAIL:],
        }
    gc.collect()  # the row's model and KV cache go before the next row starts
    _empty_cuda_cache()
    row["wall_s"] = time.perf_counter() - t0
    return row


def skipped(key: str, label: str, name: str, why: str) -> dict[str, Any]:
    log(f"({label}) {name}: skipped: {why}")
    return {"key": key, "label": label, "name": name, "status": "skipped", "reason": why}


def run_comparison(args: argparse.Namespace, argv: list[str] | None = None) -> dict[str, Any]:
    from benchmarks.bench_engine import machine_info
    from common.model_files.model_source import resolve_model

    model_dir = resolve_model(args.model)
    w = Workload(args, model_dir)
    busy_before = cpu_busy()
    workers = [int(x) for x in args.workers_list.split(",") if x.strip()]
    labels = iter("abcdefghijklmnopqrstuvwxyz")
    rows = []
    tmp = Path(tempfile.mkdtemp(prefix="zs-compare-"))
    try:
        lab = next(labels)
        name = "offline engine (in process)"
        rows.append(
            skipped("offline", lab, name, "--skip-offline")
            if args.skip_offline
            else run_row("offline", lab, name, lambda: row_offline(args, w, model_dir))
        )
        paired = None
        if rows[0]["status"] == "ok" and w.single_ids:
            log("in-process engine for the paired one-at-a-time TTFT")
            paired = PairedPrefill(args, model_dir)
        for wk in workers:
            lab = next(labels)
            rows.append(
                run_row(
                    f"server_w{wk}",
                    lab,
                    f"server --tokenize-workers {wk}",
                    lambda wk=wk, lab=lab, p=paired: row_server(
                        args, w, wk, tmp, model_dir, lab, p
                    ),
                )
            )
        del paired  # free its KV pool before the transformers and llama.cpp rows
        lab = next(labels)
        name = "transformers generate"
        rows.append(
            skipped("hf", lab, name, "--skip-hf")
            if args.skip_hf
            else run_row("hf", lab, name, lambda: row_hf(args, w, model_dir))
        )
        lab = next(labels)
        name = "llama.cpp llama-server"
        binary, why = find_llama_server(args)
        gguf, why_gguf = gguf_for(args) if binary else (None, "")
        if binary is None or gguf is None:
            rows.append(skipped("llama_server", lab, name, why or why_gguf))
        else:
            rows.append(
                run_row(
                    "llama_server",
                    lab,
                    name,
                    lambda: row_llama(args, w, binary, gguf, tmp, model_dir, lab),
                )
            )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    busy_after = cpu_busy()  # every row has stopped: what is left is other processes
    offline = next((r for r in rows if r["key"] == "offline" and r["status"] == "ok"), None)
    for r in rows:
        r["ratio_to_offline"] = (
            r["output_tok_s"] / offline["output_tok_s"]
            if offline and r["status"] == "ok" and r.get("output_tok_s")
            else None
        )
    return {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "commit": _git_commit(),
        "machine": machine_info(),
        "argv": argv,
        "args": vars(args),
        "model_dir": str(model_dir),
        "workload": w.describe(),
        "cpu_busy_before": busy_before,
        "cpu_busy_after": busy_after,
        "rows": rows,
        "checks": evaluate_checks(rows),
    }


def _git_commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None
