"""One GGUF file served by zeroserve and by llama-server, one after the other, on the same
prompts: output tok/s at each stream count, TTFT of a long prompt, memory, start-up.

Per server: start (spawn -> /health 200 is the start-up time), one short warm-up request,
then for each C of --streams: max(C, --min-requests) requests of --input-len tokens, at
most C at once, all submitted together, --output-len tokens each (ignore_eos); then
--long-requests prompts of --long-len tokens one at a time (distinct windows, so no
prefix cache hides the prefill), --long-output-len tokens each, for TTFT; the resident
memory read last (the scheduler processes for zeroserve, the process for llama-server),
then stop.
"""

from __future__ import annotations

import argparse
import math
import os
import random
import shlex
import time
from pathlib import Path
from typing import Any

from benchmarks import bench_serving
from benchmarks.comparison.gguf_types import read_types
from benchmarks.comparison.metrics import parse_metrics
from benchmarks.comparison.process import Process, free_port
from benchmarks.comparison.server_runs import bench
from benchmarks.comparison.util import log, median
from benchmarks.comparison.zeroserve_proc import (
    Zeroserve,
    proc_cpu_by_role,
    proc_memory,
    tree_pids,
)

DEFAULT_ALIAS = "smollm2"


class FilePrompts:
    """The prompts both servers see for one file, cut with the file's own tokenizer
    (the default model's when the file cannot be converted here: lengths approximate)."""

    def __init__(self, args: argparse.Namespace, tokenizer_dir: Path, tmp: Path) -> None:
        tok = bench_serving.load_tokenizer(tokenizer_dir)
        rng = random.Random(args.seed)
        n_short = 1 + max(max(args.stream_list), args.min_requests)
        short = bench_serving.random_prompts(n_short, args.input_len, 1, 0.0, rng, tok)
        n_long = args.long_requests
        long = (
            bench_serving.random_prompts(n_long, args.long_len, 1, 0.0, rng, tok) if n_long else []
        )
        self.tokenizer_dir = tokenizer_dir
        self.warmup = self._jsonl(tmp / "warmup.jsonl", [short[0].prompt], 16)
        self.short = [s.prompt for s in short[1:]]
        self.long = [s.prompt for s in long]
        self.long_tokens = [len(tok.encode(t, add_special_tokens=True).ids) for t in self.long]
        self.tmp = tmp

    @staticmethod
    def _jsonl(path: Path, texts: list[str], output_len: int) -> Path:
        import json

        with open(path, "w", encoding="utf-8") as f:
            for t in texts:
                f.write(json.dumps({"prompt": t, "output_len": output_len}) + "\n")
        return path

    def main_jsonl(self, name: str, n: int, output_len: int) -> Path:
        return self._jsonl(self.tmp / f"{name}-main-{n}.jsonl", self.short[:n], output_len)

    def long_jsonl(self, name: str, output_len: int) -> Path:
        return self._jsonl(self.tmp / f"{name}-long.jsonl", self.long, output_len)


def measure(
    args: argparse.Namespace, base_url: str, p: FilePrompts, name: str, pids: list[int]
) -> dict[str, Any]:
    """The loads of one server: per stream count, then the long prompts one at a time.
    pids: the server's processes, whose CPU seconds per stream count are recorded (on a
    shared machine tokens per CPU second move less with the load than tokens per second),
    in all and by process, beside the benchmark client's own (this process: the same
    client for both servers, on the same CPUs)."""
    bench(args, base_url, p.warmup, 1, 16, 1, f"{name} warm-up", p.tokenizer_dir)
    out: dict[str, Any] = {"streams": {}, "warnings": []}
    for c in args.stream_list:
        n = max(c, args.min_requests)
        by0, client0 = proc_cpu_by_role(pids), time.process_time()
        res = bench(
            args,
            base_url,
            p.main_jsonl(name, n, args.output_len),
            n,
            args.output_len,
            c,
            f"{name} {c} streams",
            p.tokenizer_dir,
        )
        by = {role: v - by0.get(role, 0.0) for role, v in proc_cpu_by_role(pids).items()}
        out["streams"][str(c)] = {
            "requests": n,
            "output_tok_s": res["output_throughput"],
            "tpot_median_ms": res["median_tpot_ms"],
            "ttft_median_ms": res["median_ttft_ms"],
            "failed": res["failed"],
            "output_tokens": res["total_output_tokens"],
            "cpu_s": sum(by.values()),
            "client_cpu_s": time.process_time() - client0,
            "cpu_s_by_process": by,
        }
        if res["failed"] or res["total_output_tokens"] != n * args.output_len:
            out["warnings"].append(
                f"{c} streams: {res['failed']} failed, {res['total_output_tokens']} of "
                f"{n * args.output_len} output tokens"
            )
    if p.long:
        k = len(p.long)
        res = bench(
            args,
            base_url,
            p.long_jsonl(name, args.long_output_len),
            k,
            args.long_output_len,
            1,
            f"{name} long prompts",
            p.tokenizer_dir,
        )
        ok = [r for r in res["requests"] if r["success"] and r["ttft_s"] is not None]
        ttfts = [r["ttft_s"] * 1000 for r in ok]
        out["long"] = {
            "prompt_tokens": p.long_tokens,
            "server_prompt_tokens": [r["prompt_tokens"] for r in ok],
            "ttft_ms": ttfts,
            "ttft_median_ms": median(ttfts),
            "failed": res["failed"],
        }
        if res["failed"]:
            out["warnings"].append(f"long prompts: {res['failed']} of {k} failed")
    return out


def zeroserve_row(
    args: argparse.Namespace, model: str, p: FilePrompts, log_dir: Path, tag: str
) -> dict[str, Any]:
    # like for like: llama-server drafts nothing by default (--engine-args may set a method)
    flags = ["--speculative-method", "none", *shlex.split(args.engine_args)]
    server = Zeroserve(model, flags, log_dir / f"{tag}-zeroserve.log")
    row: dict[str, Any] = {"server": "zeroserve", "started_at": time.time()}
    try:
        log(f"{tag}: starting zeroserve --model {model}")
        server.start(args.startup_timeout)
        row["command"] = server.command
        row["startup_s"] = server.startup_s
        row["memory_after_start"] = server.scheduler_memory()
        pids = tree_pids(server.proc.proc.pid)
        row.update(measure(args, server.proc.base_url, p, f"{tag}-zeroserve", pids))
        row["launch_startup_s"] = server.launch_reported_startup_s()  # printed after /health
        row["memory"] = server.scheduler_memory()
        row["weight_metrics"] = weight_metrics(server.proc.base_url)
        row["status"] = "ok"
    except Exception as e:  # a refused file or a dead server: its row says why
        row.update(status="error", error=f"{type(e).__name__}: {e}"[:2000])
        row["command"] = server.command
    finally:
        row["exit_code"] = server.stop()
    return row


def weight_metrics(base_url: str) -> dict[str, float]:
    """Whatever /metrics exports about weight memory (names with 'weight')."""
    import httpx

    try:
        m = parse_metrics(httpx.get(base_url + "/metrics", timeout=10).text)
    except httpx.HTTPError:
        return {}
    return {k: v for k, v in m.items() if "weight" in k}


def llama_row(
    args: argparse.Namespace, binary: str, gguf: Path, p: FilePrompts, log_dir: Path, tag: str
) -> dict[str, Any]:
    longest = max([args.input_len, *p.long_tokens])
    need = longest + max(args.output_len, args.long_output_len, 16) + 64  # BOS, slack
    ctx = 256 * math.ceil(need / 256)
    port = free_port()
    argv = [
        binary,
        "-m",
        str(gguf),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "-np",
        str(args.llama_np),
        "-c",
        str(args.llama_np * ctx),
        "-t",
        str(args.threads),
        *shlex.split(args.llama_args),
    ]
    row: dict[str, Any] = {
        "server": "llama-server",
        "command": shlex.join(argv),
        "started_at": time.time(),
    }
    log(f"{tag}: starting {row['command']}")
    t0 = time.perf_counter()
    proc = Process(argv, log_dir / f"{tag}-llama-server.log", f"http://127.0.0.1:{port}")
    try:
        proc.wait_healthy(args.startup_timeout)
        row["startup_s"] = time.perf_counter() - t0
        row["memory_after_start"] = {str(proc.proc.pid): proc_memory(proc.proc.pid)}
        row.update(measure(args, proc.base_url, p, f"{tag}-llama", [proc.proc.pid]))
        row["memory"] = {str(proc.proc.pid): proc_memory(proc.proc.pid)}
        row["status"] = "ok"
    except Exception as e:
        row.update(status="error", error=f"{type(e).__name__}: {e}"[:2000])
    finally:
        row["exit_code"] = proc.stop()
    return row


def file_paths(spec: str) -> tuple[str, Path]:
    """(zeroserve's --model, the GGUF file llama-server loads) for a --file entry."""
    if spec == DEFAULT_ALIAS:
        from common.model_files.model_source import default_gguf_path

        return spec, default_gguf_path()
    path = Path(spec).expanduser().resolve()
    if not path.is_file():
        raise SystemExit(f"--file {spec}: no such file")
    return str(path), path


def tokenizer_dir_for(model: str) -> tuple[Path, str | None]:
    """The file's converted directory (its tokenizer), or the default model's with why."""
    from common.model_files.model_source import resolve_model

    try:
        return resolve_model(model), None
    except Exception as e:  # an architecture the converter refuses: lengths approximate
        why = f"{model}: {type(e).__name__}: {str(e)[:200]}; prompts cut with smollm2's tokenizer"
        return resolve_model(DEFAULT_ALIAS), why


def compare_file(
    args: argparse.Namespace, spec: str, binary: str | None, log_dir: Path, tmp: Path, tag: str
) -> dict[str, Any]:
    model, gguf = file_paths(spec)
    types = read_types(gguf)
    tok_dir, why = tokenizer_dir_for(model)
    ftmp = tmp / tag
    ftmp.mkdir(parents=True, exist_ok=True)
    prompts = FilePrompts(args, tok_dir, ftmp)
    out: dict[str, Any] = {
        "file": str(gguf),
        "model_arg": model,
        "arch": types.arch,
        "file_type": types.file_type,
        "file_bytes": types.file_bytes,
        "tensor_bytes": types.tensor_bytes,
        "quantized_bytes": types.quantized_bytes,
        "tensor_types": {
            t: {"count": s.count, "bytes": s.bytes, "roles": dict(s.roles)}
            for t, s in types.per_type.items()
        },
        "long_prompt_tokens": prompts.long_tokens,
        "notes": [why] if why else [],
    }
    out["loadavg_before"] = os.getloadavg()
    if not binary:
        out["llama_server"] = {"status": "skipped", "error": "no llama-server binary"}
    elif getattr(args, "llama_first", False):
        out["llama_server"] = llama_row(args, binary, gguf, prompts, log_dir, tag)
    out["zeroserve"] = zeroserve_row(args, model, prompts, log_dir, tag)
    if binary and "llama_server" not in out:
        out["llama_server"] = llama_row(args, binary, gguf, prompts, log_dir, tag)
    out["order"] = (
        "llama-server first" if getattr(args, "llama_first", False) else "zeroserve first"
    )
    out["loadavg_after"] = os.getloadavg()
    return out
