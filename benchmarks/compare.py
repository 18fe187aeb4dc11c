"""One workload, one machine, five ways to serve it: how close the server comes to the
engine it wraps, and where it stands against transformers and llama.cpp.

    .venv/bin/python benchmarks/compare.py --json bench_results/compare.json
    .venv/bin/python benchmarks/compare.py --llama-server ~/llama.cpp/build/bin/llama-server

Rows:
  a  offline engine, in process: LLMEngine (same model, dtype, engine flags as the servers),
     the prompts as token ids, up to --concurrency requests in flight (all at once when
     --num-requests <= --concurrency), max_tokens = --output-len, ignore_eos. The upper
     bound. Also its in-process prefill: add_request -> first token of one request on an
     idle engine, mean over the --single-requests prompts (none of them cached).
  b, c  our server, `launch.py --tokenize-workers W` for each W of --workers-list (default
     4,1), a subprocess on a free loopback port with a private run dir. bench_serving in
     process: the main load (--num-requests streams, at most --concurrency at once, all
     submitted together; /metrics read before and after gives the scheduler's busy split:
     forward share = d(forward) / d(forward + sample + schedule + ipc)), then one request
     at a time over the single-request prompts (max_tokens --single-output-len) for TTFT,
     each right after an in-process prefill of the same prompt (an engine kept for it, no
     prefix cache) when row (a) ran: the TTFT check uses these pairs, since this kind of
     VM drifts in speed by up to 2x over minutes.
  d  transformers `generate` as a user writes it: the same prompt texts, tokenizer with
     left padding + attention mask, static batches of --hf-batch (default --concurrency),
     greedy, max_new_tokens = min_new_tokens = --output-len, dtype --hf-dtype (auto: the
     engine's rule, bfloat16 on a CPU with AVX512-BF16/AMX, else float32). TTFT: generate
     of 1 token per single-request prompt, batch 1.
  e  llama.cpp's llama-server on the same GGUF file (default model: the embedded one;
     note it runs the GGUF's own quantization, Q4_1, where our engine dequantizes to
     --dtype), `-np C -c C*ctx -t threads`, the same bench_serving loads; when
     --llama-server is given or `llama-server` is on PATH, else reported as skipped.

Every row sees the same prompts: windows of benchmarks/data/ of --input-len tokens (the
model's tokenizer), one warm-up prompt, the main prompts, then --single-requests more for
the one-at-a-time runs (distinct, so no prefix/prompt cache hides their prefill).

Target checks (on row b, the first of --workers-list): server throughput >= 0.9x offline;
forward >= 90% of scheduler busy time under the main load; one-at-a-time TTFT p50 <=
in-process prefill + 15 ms (median of the paired differences when they were measured). Checks are reported (PASS/FAIL/SKIP), never the exit status:
that is 1 only when a row failed to run (its error is in the row), else 0.

Rows are lettered in order, so with another --workers-list or a skipped row the letters
after (a) shift; the JSON's `key` (offline, server_wN, hf, llama_server) does not.
--json FILE keeps every figure (bench_serving's full results with per-request records,
the busy split, the offline engine's stage times), machine_info, argv and the args.

Run it on an idle machine: another process on the cores moves these figures a lot (the
CPUs' busy share from other processes is sampled before and after the run and warned of).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import gc
import json
import math
import os
import random
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from collections import deque
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if __package__ in (None, ""):  # `python benchmarks/compare.py`: make `benchmarks.` importable
    sys.path.insert(0, str(REPO))

from benchmarks import bench_serving  # noqa: E402

THROUGHPUT_TARGET = 0.9  # server output tok/s >= this x offline
FORWARD_TARGET = 0.9  # forward share of scheduler busy time under the main load
TTFT_SLACK_MS = 15.0  # one-at-a-time TTFT p50 <= in-process prefill + this
HEARTBEAT_WAIT_S = 1.5  # the scheduler reports its counters every heartbeat (1 s)
LOG_TAIL = 3000
BUSY_WARN = 0.15  # CPUs busier than this before/after the run (nothing of ours running): warn
PR_SET_PDEATHSIG = 1


def log(msg: str) -> None:
    print(f"[compare] {msg}", file=sys.stderr, flush=True)


# -- workload -----------------------------------------------------------------------------
class Workload:
    """The prompts every row sees, as text and as the token ids the server's tokenizer
    makes of them (`add_special_tokens=True`, like tokenizer_worker)."""

    def __init__(self, args: argparse.Namespace, model_dir: Path) -> None:
        tok = bench_serving.load_tokenizer(model_dir)
        n, k = args.num_requests, args.single_requests
        rng = random.Random(args.seed)
        specs = bench_serving.random_prompts(1 + n + k, args.input_len, args.output_len, 0.0,
                                             rng, tok)  # fmt: skip
        texts = [s.prompt for s in specs]
        ids = [tok.encode(t, add_special_tokens=True).ids for t in texts]
        self.warmup_text, self.warmup_ids = texts[0], ids[0]
        self.main_texts, self.main_ids = texts[1 : 1 + n], ids[1 : 1 + n]
        self.single_texts, self.single_ids = texts[1 + n :], ids[1 + n :]
        self.output_len = args.output_len
        self.single_output_len = args.single_output_len

    def describe(self) -> dict[str, Any]:
        lens = [len(x) for x in self.main_ids]
        single = [len(x) for x in self.single_ids]
        return {"num_requests": len(self.main_ids), "output_len": self.output_len,
                "input_tokens_min": min(lens), "input_tokens_max": max(lens),
                "input_tokens_mean": sum(lens) / len(lens),
                "single_requests": len(self.single_ids),
                "single_input_tokens_mean": sum(single) / len(single) if single else None,
                "single_output_len": self.single_output_len}  # fmt: skip

    def write_jsonl(self, path: Path, texts: list[str], output_len: int) -> Path:
        with open(path, "w", encoding="utf-8") as f:
            for t in texts:
                f.write(json.dumps({"prompt": t, "output_len": output_len}) + "\n")
        return path


# -- helpers ------------------------------------------------------------------------------
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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent(parent_pid: int) -> None:  # child, between fork and exec
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent_pid:
        os._exit(1)


def median(values: list[float]) -> float | None:
    return bench_serving.percentile(values, 50) if values else None


def mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text -> {name{labels}: value} (comments skipped)."""
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            with contextlib.suppress(ValueError):
                out[name] = float(value)
    return out


_BUSY_RE = re.compile(r'^zeroserve:scheduler_busy_seconds_total\{part="([^"]+)"\}$')


def busy_parts(metrics: dict[str, float]) -> dict[str, float]:
    out = {}
    for name, v in metrics.items():
        if m := _BUSY_RE.match(name):
            out[m.group(1)] = v
    return out


def busy_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, Any]:
    """The busy split of a run from /metrics read before and after it."""
    b0, b1 = busy_parts(before), busy_parts(after)
    delta = {p: b1.get(p, 0.0) - b0.get(p, 0.0) for p in sorted(set(b0) | set(b1))}
    total = sum(delta.values())
    shares = {p: (v / total if total > 0 else None) for p, v in delta.items()}
    return {"seconds": delta, "total_s": total, "shares": shares,
            "forward_share": shares.get("forward")}  # fmt: skip


COUNTERS = ("zeroserve:prompt_tokens_total", "zeroserve:generation_tokens_total",
            "zeroserve:prefix_cache_hits_total", "zeroserve:prefix_cache_queries_total")


def counter_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {k: after.get(k, 0.0) - before.get(k, 0.0) for k in COUNTERS}


class Process:
    """A server subprocess (ours or llama-server) with its log file."""

    def __init__(self, argv: list[str], log_path: Path, base_url: str,
                 env: dict[str, str] | None = None) -> None:  # fmt: skip
        self.argv, self.log_path, self.base_url = argv, log_path, base_url
        parent = os.getpid()
        with open(log_path, "wb") as f:
            self.proc = subprocess.Popen(argv, cwd=REPO, stdout=f, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, env=env,
                                         preexec_fn=lambda: _die_with_parent(parent))  # fmt: skip

    def log_tail(self, n: int = LOG_TAIL) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def wait_healthy(self, timeout_s: float) -> None:
        import httpx

        deadline = time.monotonic() + timeout_s
        last = "no answer"
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"exited with code {self.proc.returncode} before /health "
                                   f"answered 200; log tail:\n{self.log_tail()}")  # fmt: skip
            try:
                r = httpx.get(self.base_url + "/health", timeout=2)
                if r.status_code == 200:
                    return
                last = f"HTTP {r.status_code}"
            except httpx.HTTPError as e:
                last = type(e).__name__
            if time.monotonic() > deadline:
                raise RuntimeError(f"/health not 200 after {timeout_s:.0f} s ({last}); log "
                                   f"tail:\n{self.log_tail()}")  # fmt: skip
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
    """Metrics once the scheduler has reported an idle engine after the last activity
    (its counters ride on the heartbeat, so wait one first)."""
    time.sleep(HEARTBEAT_WAIT_S)
    deadline = time.monotonic() + timeout_s
    while True:
        m = server.metrics()
        if all(m.get(f"zeroserve:num_requests_{k}", 0) == 0
               for k in ("running", "waiting", "in_flight")):  # fmt: skip
            return m
        if time.monotonic() > deadline:
            raise RuntimeError(f"server not idle after {timeout_s:.0f} s")
        time.sleep(0.2)


def bench(args: argparse.Namespace, base_url: str, jsonl: Path, n: int, output_len: int,
          concurrency: int, label: str, tokenizer_dir: Path) -> dict[str, Any]:  # fmt: skip
    """One bench_serving run, in process, every request submitted at once."""
    argv = ["--base-url", base_url, "--dataset", "jsonl", "--dataset-path", str(jsonl),
            "--num-prompts", str(n), "--output-len", str(output_len),
            "--max-concurrency", str(concurrency), "--warmup-requests", "0",
            "--tokenizer", str(tokenizer_dir), "--seed", str(args.seed),
            "--timeout", str(args.request_timeout), "--label", label, "--disable-tqdm"]  # fmt: skip
    res = asyncio.run(bench_serving.run_benchmark(bench_serving.parse_args(argv)))
    if res["completed"] == 0:
        raise RuntimeError(f"{label}: every request failed: {res['errors'][:3]}")
    return res


def serving_summary(res: dict[str, Any], expected_tokens: int) -> dict[str, Any]:
    keys = ("completed", "failed", "duration_s", "total_input_tokens", "total_output_tokens",
            "output_throughput", "median_ttft_ms", "mean_ttft_ms", "p90_ttft_ms",
            "median_tpot_ms", "mean_tpot_ms", "median_itl_ms", "median_e2el_ms", "errors")
    out = {k: res.get(k) for k in keys}
    out["expected_output_tokens"] = expected_tokens
    return out


def _warn_if_short(row: dict[str, Any], name: str, res: dict[str, Any], expected: int) -> None:
    if res["failed"]:
        row["warnings"].append(f"{name}: {res['failed']} of {res['num_requests']} requests "
                               f"failed: {res['errors'][:2]}")  # fmt: skip
    if res["total_output_tokens"] != expected:
        row["warnings"].append(f"{name}: {res['total_output_tokens']} output tokens, expected "
                               f"{expected} (ignore_eos not honoured?)")  # fmt: skip


def engine_flags(args: argparse.Namespace) -> list[str]:
    """The engine flags given to every server and, parsed the same way, to the offline engine."""
    from common.config import SchedulerConfig

    seqs = max(args.concurrency, SchedulerConfig().max_num_seqs)
    return ["--model", args.model, "--dtype", args.dtype, "--device", args.device,
            "--max-num-seqs", str(seqs), *shlex.split(args.engine_args)]  # fmt: skip


def engine_config(args: argparse.Namespace):
    from common.cli import add_config_args, config_from_args

    p = argparse.ArgumentParser()
    add_config_args(p)
    return config_from_args(p.parse_args(engine_flags(args))).engine


# -- (a) offline engine -------------------------------------------------------------------
def offline_load(engine, prompts: list[list[int]], output_len: int,
                 concurrency: int) -> dict[str, Any]:  # fmt: skip
    """Closed loop like the client's: at most `concurrency` requests in the engine."""
    from common.sampling_params import SamplingParams

    params = SamplingParams(max_tokens=output_len, temperature=0.0, ignore_eos=True)
    pending = deque(enumerate(prompts))
    start: dict[str, float] = {}
    first: dict[str, float] = {}
    end: dict[str, float] = {}
    counts: dict[str, int] = {}
    busy0 = dict(engine.counters.busy_time)

    def admit() -> None:
        while pending and engine.num_unfinished < concurrency:
            i, p = pending.popleft()
            rid = f"cmp-{i}"
            start[rid] = time.perf_counter()
            counts[rid] = 0
            engine.add_request(rid, p, params)

    t0 = time.perf_counter()
    admit()
    while engine.has_unfinished() or pending:
        outs = engine.step()
        now = time.perf_counter()
        for o in outs:
            if o.request_id not in counts:
                continue
            if o.new_token_ids:
                counts[o.request_id] += len(o.new_token_ids)
                first.setdefault(o.request_id, now)
            if o.finish_reason is not None:
                end[o.request_id] = now
        admit()
    elapsed = time.perf_counter() - t0
    n_out = sum(counts.values())
    busy = {k: engine.counters.busy_time[k] - busy0[k] for k in busy0}
    total = sum(busy.values())
    ttft = [first[r] - start[r] for r in first]
    tpot = [(end[r] - first[r]) / (counts[r] - 1) for r in end if counts[r] > 1 and r in first]
    return {"seconds": elapsed, "output_tokens": n_out, "expected_output_tokens":
            len(prompts) * output_len, "output_throughput": n_out / elapsed,
            "busy_seconds": busy, "forward_share": busy["forward"] / total if total else None,
            "median_ttft_ms": 1e3 * median(ttft) if ttft else None,
            "median_tpot_ms": 1e3 * median(tpot) if tpot else None}  # fmt: skip


def prefill_times(engine, prompts: list[list[int]]) -> dict[str, Any]:
    """add_request -> first token of one request at a time on an idle engine."""
    from common.sampling_params import SamplingParams

    params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    times, cached = [], []
    for i, p in enumerate(prompts):
        rid = f"prefill-{i}"
        t0 = time.perf_counter()
        engine.add_request(rid, p, params)
        got = None
        while got is None:
            for o in engine.step():
                if o.request_id == rid and o.new_token_ids:
                    got = time.perf_counter() - t0
                    cached.append(o.num_cached_tokens)
        times.append(got)
        while engine.has_unfinished():
            engine.step()
    ms = [t * 1e3 for t in times]
    return {"mean_ms": mean(ms), "median_ms": median(ms), "min_ms": min(ms), "max_ms": max(ms),
            "runs": len(ms), "num_cached_tokens": cached}  # fmt: skip


class PairedPrefill:
    """An in-process engine for paired TTFT: this VM's speed drifts by 2x over minutes
    (docs/benchmarks.md), so the one-at-a-time check compares each server request with an
    in-process prefill of the same prompt run just before it, not with row (a)'s prefill
    measured minutes earlier. Prefix caching is off so a prompt can be prefilled again."""

    def __init__(self, args: argparse.Namespace, model_dir: Path) -> None:
        from dataclasses import replace

        from common.sampling_params import SamplingParams
        from scheduler_worker.engine import LLMEngine

        cfg = engine_config(args)
        cfg = replace(cfg, cache=replace(cfg.cache, enable_prefix_caching=False,
                                         num_blocks=None, kv_cache_memory_gb=0.25))  # fmt: skip
        self.engine = LLMEngine(cfg, model_dir)
        self.engine.generate([[1, 2, 3, 4]], SamplingParams(max_tokens=4, ignore_eos=True))

    def prefill_ms(self, ids: list[int]) -> float:
        return prefill_times(self.engine, [ids])["mean_ms"]


def paired_ttft(args: argparse.Namespace, w: Workload, paired: PairedPrefill, base_url: str,
                tmp: Path, name: str, model_dir: Path) -> dict[str, Any]:  # fmt: skip
    """The one-at-a-time run, paired: for each prompt, an in-process prefill of it, then
    the server's TTFT for it (bench_serving, one request)."""
    pre, ttft, results = [], [], []
    for i, (text, ids) in enumerate(zip(w.single_texts, w.single_ids)):
        pre.append(paired.prefill_ms(ids))
        one = w.write_jsonl(tmp / f"{name}-single-{i}.jsonl", [text], w.single_output_len)
        res = bench(args, base_url, one, 1, w.single_output_len, 1, f"{name} one at a time {i}",
                    model_dir)  # fmt: skip
        results.append(res)
        ttft.append(res["median_ttft_ms"])
    over = [t - p for t, p in zip(ttft, pre)]
    return {"prefill_ms": pre, "ttft_ms": ttft, "overhead_ms": over,
            "median_overhead_ms": median(over), "median_prefill_ms": median(pre),
            "median_ttft_ms": median(ttft), "results": results}  # fmt: skip


def row_offline(args: argparse.Namespace, w: Workload, model_dir: Path) -> dict[str, Any]:
    from common.sampling_params import SamplingParams
    from scheduler_worker.engine import LLMEngine

    cfg = engine_config(args)
    engine = LLMEngine(cfg, model_dir)
    dtype = str(engine.runner.dtype).replace("torch.", "")
    engine.generate([w.warmup_ids], SamplingParams(max_tokens=16, ignore_eos=True))
    load = offline_load(engine, w.main_ids, w.output_len, args.concurrency)
    prefill = prefill_times(engine, w.single_ids) if w.single_ids else None
    row = {"dtype": dtype, "device": str(engine.runner.device),
           "max_num_seqs": cfg.scheduler.max_num_seqs, "main": load, "prefill": prefill,
           "output_tok_s": load["output_throughput"],
           "ttft_p50_ms": prefill["mean_ms"] if prefill else None,
           "tpot_median_ms": load["median_tpot_ms"],
           "forward_share": load["forward_share"], "warnings": []}  # fmt: skip
    if load["output_tokens"] != load["expected_output_tokens"]:
        row["warnings"].append(f"{load['output_tokens']} output tokens, expected "
                               f"{load['expected_output_tokens']}")  # fmt: skip
    if prefill and any(prefill["num_cached_tokens"]):
        row["warnings"].append(f"prefill prompts hit the prefix cache: "
                               f"{prefill['num_cached_tokens']}")  # fmt: skip
    return row


def _empty_cuda_cache() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()


# -- (b, c) our server --------------------------------------------------------------------
def serving_runs(args: argparse.Namespace, w: Workload, proc: Process, tmp: Path, name: str,
                 model_dir: Path, metrics: bool,
                 paired: PairedPrefill | None = None) -> dict[str, Any]:  # fmt: skip
    """Warm-up, main load (with the busy split when `metrics`), one at a time, and the
    paired TTFT when `paired` is given."""
    row: dict[str, Any] = {"warnings": []}
    warm = w.write_jsonl(tmp / f"{name}-warmup.jsonl", [w.warmup_text], 16)
    main = w.write_jsonl(tmp / f"{name}-main.jsonl", w.main_texts, w.output_len)
    bench(args, proc.base_url, warm, 1, 16, 1, f"{name} warm-up", model_dir)
    before = wait_idle(proc) if metrics else None
    n = len(w.main_texts)
    res = bench(args, proc.base_url, main, n, w.output_len, args.concurrency, f"{name} main",
                model_dir)  # fmt: skip
    expected = n * w.output_len
    row["main"] = serving_summary(res, expected)
    row["main_full"] = res
    _warn_if_short(row, "main load", res, expected)
    if metrics:
        after = wait_idle(proc)
        row["busy"] = busy_delta(before, after)
        row["forward_share"] = row["busy"]["forward_share"]
        row["metrics_delta"] = counter_delta(before, after)
    prompt_tokens = [r["prompt_tokens"] for r in res["requests"] if r["success"]]
    local = [len(x) for x in w.main_ids]
    if metrics and prompt_tokens and sorted(prompt_tokens) != sorted(local):
        row["warnings"].append("the server counted other prompt lengths than the local "
                               "tokenizer (the offline row saw different token ids)")  # fmt: skip
    row["output_tok_s"] = res["output_throughput"]
    row["tpot_median_ms"] = res["median_tpot_ms"]
    if w.single_texts:
        k = len(w.single_texts)
        if paired is None:
            single = w.write_jsonl(tmp / f"{name}-single.jsonl", w.single_texts,
                                   w.single_output_len)  # fmt: skip
            res1 = bench(args, proc.base_url, single, k, w.single_output_len, 1,
                         f"{name} one at a time", model_dir)  # fmt: skip
            row["single"] = serving_summary(res1, k * w.single_output_len)
            row["single_full"] = res1
            row["ttft_p50_ms"] = res1["median_ttft_ms"]
            _warn_if_short(row, "one at a time", res1, k * w.single_output_len)
        else:
            pt = row["paired_ttft"] = paired_ttft(args, w, paired, proc.base_url, tmp, name,
                                                  model_dir)  # fmt: skip
            row["ttft_p50_ms"] = pt["median_ttft_ms"]
            row["single_full"] = pt.pop("results")
            row["single"] = {"completed": sum(r["completed"] for r in row["single_full"]),
                             "failed": sum(r["failed"] for r in row["single_full"]),
                             "total_output_tokens": sum(r["total_output_tokens"]
                                                        for r in row["single_full"]),
                             "median_ttft_ms": pt["median_ttft_ms"],
                             "expected_output_tokens": k * w.single_output_len}  # fmt: skip
            for i, res1 in enumerate(row["single_full"]):
                _warn_if_short(row, f"one at a time, prompt {i}", res1, w.single_output_len)
        if metrics:
            d = row["single_metrics_delta"] = counter_delta(after, wait_idle(proc))
            if d["zeroserve:prefix_cache_hits_total"]:
                row["warnings"].append(f"one at a time: {d['zeroserve:prefix_cache_hits_total']:.0f}"
                                       " prompt tokens came from the prefix cache")  # fmt: skip
    return row


class RowError(RuntimeError):
    """A row that failed after it had figures worth keeping (command, log tail...)."""

    def __init__(self, message: str, extra: dict[str, Any]) -> None:
        super().__init__(message)
        self.extra = extra


def _row_failed(e: Exception, row: dict[str, Any], proc: Process) -> RowError:
    row["log_tail"] = proc.log_tail()
    return RowError(f"{type(e).__name__}: {e}", row)


def row_server(args: argparse.Namespace, w: Workload, workers: int, tmp: Path,
               model_dir: Path, tag: str, paired: PairedPrefill | None) -> dict[str, Any]:  # fmt: skip
    port = free_port()
    run_dir = Path(tempfile.mkdtemp(prefix="zs-cmp-", dir="/tmp"))  # short: ipc paths
    argv = [sys.executable, str(REPO / "launch.py"), "--host", "127.0.0.1", "--port", str(port),
            "--tokenize-workers", str(workers), "--run-dir", str(run_dir),
            *engine_flags(args)]  # fmt: skip
    log_path = _log_dir(args, tmp) / f"{tag}-server-w{workers}.log"
    log(f"starting {shlex.join(argv[1:])} (log {log_path})")
    proc = Process(argv, log_path, f"http://127.0.0.1:{port}",
                   env={**os.environ, "PYTHONUNBUFFERED": "1"})  # fmt: skip
    row: dict[str, Any] = {"command": argv, "log": str(log_path) if args.log_dir else None}
    try:
        t0 = time.perf_counter()
        proc.wait_healthy(args.startup_timeout)
        row["startup_s"] = time.perf_counter() - t0
        row.update(serving_runs(args, w, proc, tmp, f"server-w{workers}", model_dir, True,
                                paired))  # fmt: skip
    except Exception as e:
        raise _row_failed(e, row, proc) from e
    finally:
        row["exit_code"] = proc.stop()
        shutil.rmtree(run_dir, ignore_errors=True)
    if row["exit_code"] != 0:
        row.setdefault("warnings", []).append(f"exit code {row['exit_code']} after SIGTERM")
    return row


def _log_dir(args: argparse.Namespace, tmp: Path) -> Path:
    d = Path(args.log_dir) if args.log_dir else tmp
    d.mkdir(parents=True, exist_ok=True)
    return d


# -- (d) transformers ---------------------------------------------------------------------
def hf_dtype(args: argparse.Namespace):
    from scheduler_worker.model_runner import _DTYPES, resolve_device, resolve_dtype

    device = resolve_device(args.device)
    if args.hf_dtype == "auto":
        return resolve_dtype("auto", device), device
    return _DTYPES[args.hf_dtype], device


def row_hf(args: argparse.Namespace, w: Workload, model_dir: Path) -> dict[str, Any]:
    import torch
    import transformers

    dtype, device = hf_dtype(args)
    batch = args.hf_batch or args.concurrency
    n = w.output_len
    tok = transformers.AutoTokenizer.from_pretrained(model_dir, padding_side="left")
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype)
    model = model.to(device).eval()

    def generate(texts: list[str], new: int) -> int:
        enc = tok(texts, return_tensors="pt", padding=True).to(device)
        out = model.generate(**enc, max_new_tokens=new, min_new_tokens=new, do_sample=False,
                             pad_token_id=tok.pad_token_id)  # fmt: skip
        got = out.shape[1] - enc["input_ids"].shape[1]
        if got != new:
            raise RuntimeError(f"generate made {got} tokens, asked for {new}")
        return got * len(texts)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()

    with torch.inference_mode():
        generate([w.warmup_text], 16)
        sync()
        t0 = time.perf_counter()
        n_out = 0
        for i in range(0, len(w.main_texts), batch):
            n_out += generate(w.main_texts[i : i + batch], n)
        sync()
        elapsed = time.perf_counter() - t0
        ttft = []
        for text in w.single_texts:
            t1 = time.perf_counter()
            generate([text], 1)
            sync()
            ttft.append((time.perf_counter() - t1) * 1e3)
    return {"dtype": str(dtype).replace("torch.", ""), "device": str(device),
            "batch": batch, "transformers": transformers.__version__,
            "main": {"seconds": elapsed, "output_tokens": n_out,
                     "output_throughput": n_out / elapsed},
            "single_ttft_ms": ttft, "output_tok_s": n_out / elapsed,
            "ttft_p50_ms": median(ttft), "tpot_median_ms": None, "forward_share": None,
            "warnings": []}  # fmt: skip


# -- (e) llama.cpp ------------------------------------------------------------------------
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
    from common.model_source import DEFAULT_MODEL_ALIAS, ModelSourceError, default_gguf_path

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


def row_llama(args: argparse.Namespace, w: Workload, binary: str, gguf: Path, tmp: Path,
              model_dir: Path, tag: str) -> dict[str, Any]:  # fmt: skip
    port = free_port()
    ctx = llama_ctx_per_slot(args, w)
    threads = llama_threads(args)
    argv = [binary, "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port),
            "-np", str(args.concurrency), "-c", str(args.concurrency * ctx), "-t", str(threads),
            *shlex.split(args.llama_args)]  # fmt: skip
    log_path = _log_dir(args, tmp) / f"{tag}-llama-server.log"
    log(f"starting {shlex.join(argv)} (log {log_path})")
    proc = Process(argv, log_path, f"http://127.0.0.1:{port}")
    row: dict[str, Any] = {"command": argv, "log": str(log_path) if args.log_dir else None,
                           "gguf": str(gguf),
                           "ctx_per_slot": ctx, "threads": threads}  # fmt: skip
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


# -- the comparison -----------------------------------------------------------------------
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
        row = {**getattr(e, "extra", {}), "key": key, "label": label, "name": name,
               "status": "error", "error": msg, "traceback": tb[-LOG_TAIL:]}  # fmt: skip
    gc.collect()  # the row's model and KV cache go before the next row starts
    _empty_cuda_cache()
    row["wall_s"] = time.perf_counter() - t0
    return row


def skipped(key: str, label: str, name: str, why: str) -> dict[str, Any]:
    log(f"({label}) {name}: skipped: {why}")
    return {"key": key, "label": label, "name": name, "status": "skipped", "reason": why}


def evaluate_checks(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The three targets, on the first server row (b): PASS, FAIL, or SKIP without data."""
    offline = next((r for r in rows if r["key"] == "offline" and r["status"] == "ok"), None)
    b = next((r for r in rows if r["key"].startswith("server")), None)

    def check(name: str, target: str, needs_offline: bool, fn) -> dict[str, Any]:
        out: dict[str, Any] = {"name": name, "target": target, "row": b and b["label"]}
        missing = []
        if b is None or b["status"] != "ok":
            missing.append("no server row ran" if b is None else f"({b['label']}) did not run")
        if needs_offline and offline is None:
            missing.append("the offline row (a) did not run")
        if missing:
            return {**out, "status": "SKIP", "value": None, "detail": "; ".join(missing)}
        try:
            passed, value, detail = fn()
        except (TypeError, KeyError) as e:  # a figure that is None or absent: no data
            return {**out, "status": "SKIP", "value": None, "detail": f"no data ({e!r})"}
        return {**out, "status": "PASS" if passed else "FAIL", "value": value, "detail": detail}

    def thr():
        ratio = b["output_tok_s"] / offline["output_tok_s"]
        return (ratio >= THROUGHPUT_TARGET, ratio,
                f"{b['output_tok_s']:.1f} / {offline['output_tok_s']:.1f} tok/s = {ratio:.2f}x")

    def fwd():
        share = b["forward_share"]
        parts = ", ".join(f"{p} {v:.1%}" for p, v in b["busy"]["shares"].items() if v is not None)
        return share >= FORWARD_TARGET, share, f"{share:.1%} ({parts})"

    def ttft():
        pt = b.get("paired_ttft")
        if pt:
            over, p50, pre = pt["median_overhead_ms"], pt["median_ttft_ms"], pt["median_prefill_ms"]
            return (over <= TTFT_SLACK_MS, over,
                    f"paired, each request after an in-process prefill of its prompt: median "
                    f"overhead {over:+.1f} ms (TTFT p50 {p50:.1f} ms, in-process prefill p50 "
                    f"{pre:.1f} ms)")  # fmt: skip
        p50, pre = b["ttft_p50_ms"], offline["prefill"]["mean_ms"]
        return (p50 <= pre + TTFT_SLACK_MS, p50 - pre,
                f"{p50:.1f} ms vs {pre:.1f} + {TTFT_SLACK_MS:.0f} = {pre + TTFT_SLACK_MS:.1f} ms "
                f"(overhead {p50 - pre:+.1f} ms)")

    return [
        check("server_throughput", f"server output tok/s >= {THROUGHPUT_TARGET}x offline (a)",
              True, thr),
        check("forward_share", f"forward >= {FORWARD_TARGET:.0%} of scheduler busy time under "
              "the main load", False, fwd),
        check("ttft_overhead", f"one-at-a-time TTFT p50 <= in-process prefill + "
              f"{TTFT_SLACK_MS:.0f} ms", True, ttft),
    ]  # fmt: skip


def run_comparison(args: argparse.Namespace, argv: list[str] | None = None) -> dict[str, Any]:
    from benchmarks.bench_engine import machine_info
    from common.model_source import resolve_model

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
        rows.append(skipped("offline", lab, name, "--skip-offline") if args.skip_offline
                    else run_row("offline", lab, name, lambda: row_offline(args, w, model_dir)))
        paired = None
        if rows[0]["status"] == "ok" and w.single_ids:
            log("in-process engine for the paired one-at-a-time TTFT")
            paired = PairedPrefill(args, model_dir)
        for wk in workers:
            lab = next(labels)
            rows.append(run_row(f"server_w{wk}", lab, f"server --tokenize-workers {wk}",
                                lambda wk=wk, lab=lab, p=paired: row_server(args, w, wk, tmp,
                                                                            model_dir, lab, p)))  # fmt: skip
        del paired  # free its KV pool before the transformers and llama.cpp rows
        lab = next(labels)
        name = "transformers generate"
        rows.append(skipped("hf", lab, name, "--skip-hf") if args.skip_hf
                    else run_row("hf", lab, name, lambda: row_hf(args, w, model_dir)))
        lab = next(labels)
        name = "llama.cpp llama-server"
        binary, why = find_llama_server(args)
        gguf, why_gguf = gguf_for(args) if binary else (None, "")
        if binary is None or gguf is None:
            rows.append(skipped("llama_server", lab, name, why or why_gguf))
        else:
            rows.append(run_row("llama_server", lab, name,
                                lambda: row_llama(args, w, binary, gguf, tmp, model_dir, lab)))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    busy_after = cpu_busy()  # every row has stopped: what is left is other processes
    offline = next((r for r in rows if r["key"] == "offline" and r["status"] == "ok"), None)
    for r in rows:
        r["ratio_to_offline"] = (r["output_tok_s"] / offline["output_tok_s"]
                                 if offline and r["status"] == "ok" and r.get("output_tok_s")
                                 else None)  # fmt: skip
    return {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "commit": _git_commit(), "machine": machine_info(), "argv": argv,
            "args": vars(args), "model_dir": str(model_dir), "workload": w.describe(),
            "cpu_busy_before": busy_before, "cpu_busy_after": busy_after,
            "rows": rows, "checks": evaluate_checks(rows)}  # fmt: skip


def _git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True,
                             text=True, timeout=10)  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


# -- output -------------------------------------------------------------------------------
def _f(v: Any, fmt: str, suffix: str = "") -> str:
    return "n/a" if v is None else format(v, fmt) + suffix


def row_title(r: dict[str, Any]) -> str:
    extra = []
    if r["status"] == "ok":
        if r["key"] == "offline":
            extra.append(r["dtype"])
        elif r["key"] == "hf":
            extra.append(f"{r['dtype']}, batch {r['batch']}")
        elif r["key"] == "llama_server":
            extra.append(Path(r["gguf"]).name)
    return f"{r['label']}  {r['name']}" + (f" ({', '.join(extra)})" if extra else "")


def format_table(res: dict[str, Any]) -> str:
    wl, a = res["workload"], res["args"]
    m = res["machine"]
    lines = [f"{wl['num_requests']} streams, at most {a['concurrency']} at once, input "
             f"{wl['input_tokens_min']}-{wl['input_tokens_max']} tokens, output "
             f"{wl['output_len']} (ignore_eos); one at a time: {wl['single_requests']} "
             f"prompts, output {wl['single_output_len']}",
             f"model {a['model']}, --dtype {a['dtype']}; {m['cpu']}, {m['threads']} threads, "
             f"torch {m['torch']}", ""]  # fmt: skip
    head = ("", "output tok/s", "vs (a)", "TTFT p50 1-at-a-time", "TPOT median", "forward share")
    table = [head]
    notes = []
    for r in res["rows"]:
        title = row_title(r)
        if r["status"] == "skipped":
            table.append((title, f"skipped: {r['reason']}"))
            continue
        if r["status"] == "error":
            table.append((title, f"ERROR: {r['error'].splitlines()[0][:160]}"))
            continue
        ttft = _f(r.get("ttft_p50_ms"), ".1f", " ms")
        if r["key"] == "offline" and r.get("prefill"):
            ttft += " *"
            notes.append("* (a): in-process prefill, add_request -> first token, mean of "
                         f"{r['prefill']['runs']} prompts")  # fmt: skip
        table.append((title, _f(r.get("output_tok_s"), ".1f"),
                      _f(r.get("ratio_to_offline"), ".2f", "x"), ttft,
                      _f(r.get("tpot_median_ms"), ".1f", " ms"),
                      _f(r.get("forward_share"), ".1%")))  # fmt: skip
        for wmsg in r.get("warnings") or []:
            notes.append(f"({r['label']}) warning: {wmsg}")
    width0 = max(len(t[0]) for t in table)
    widths = [max((len(t[i]) for t in table if len(t) > 2), default=0)
              for i in range(1, len(head))]  # fmt: skip
    for t in table:
        if len(t) == 2:
            lines.append(f"{t[0]:<{width0}}  {t[1]}")
        else:
            lines.append(f"{t[0]:<{width0}}  " + "  ".join(f"{c:>{wd}}" for c, wd in
                                                           zip(t[1:], widths)))
    lines += notes
    busy = {k: res.get(f"cpu_busy_{k}") for k in ("before", "after")}
    if any(v is not None and v > BUSY_WARN for v in busy.values()):
        lines.append("warning: other processes kept the CPUs busy (" + ", ".join(
            f"{v:.0%} {k} the run" for k, v in busy.items() if v is not None) +
            "): these figures are not an idle machine's")  # fmt: skip
    lines.append("")
    lines.append("target checks:")
    for c in res["checks"]:
        row = f" ({c['row']})" if c.get("row") else ""
        lines.append(f"  {c['status']:<4}  {c['target']}{row}: {c['detail']}")
    return "\n".join(lines)


# -- command line -------------------------------------------------------------------------
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--model", default="smollm2", help="as launch.py --model")
    p.add_argument("--dtype", default="auto", choices=("auto", "float32", "bfloat16", "float16"),
                   help="engine dtype (rows a-c)")  # fmt: skip
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    p.add_argument("--engine-args", default="",
                   help="more launch.py engine flags for rows a-c, e.g. '--kv-cache-memory-gb 2'")
    p.add_argument("--num-requests", type=int, default=None,
                   help="main-load requests (default: --concurrency)")  # fmt: skip
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--single-requests", type=int, default=10,
                   help="one-at-a-time requests (distinct prompts) for TTFT and prefill")
    p.add_argument("--single-output-len", type=int, default=16)
    p.add_argument("--workers-list", default="4,1", help="--tokenize-workers of each server row")
    p.add_argument("--skip-offline", action="store_true")
    p.add_argument("--skip-hf", action="store_true")
    p.add_argument("--hf-dtype", default="auto", choices=("auto", "float32", "bfloat16", "float16"))
    p.add_argument("--hf-batch", type=int, default=None, help="default: --concurrency")
    p.add_argument("--llama-server", help="llama.cpp's llama-server binary (default: on PATH)")
    p.add_argument("--gguf", help="GGUF for llama-server (default: the default model's)")
    p.add_argument("--llama-threads", type=int, default=None,
                   help="llama-server -t (default: torch's thread count, as our engine)")
    p.add_argument("--llama-ctx-per-slot", type=int, default=None,
                   help="default: the longest prompt + output, rounded up to 256")  # fmt: skip
    p.add_argument("--llama-args", default="", help="more llama-server flags")
    p.add_argument("--startup-timeout", type=float, default=300.0)
    p.add_argument("--request-timeout", type=float, default=1800.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log-dir", help="keep the servers' logs here (default: a temp dir)")
    p.add_argument("--json", help="write every figure, machine_info and the args here")
    args = p.parse_args(argv)
    if args.num_requests is None:
        args.num_requests = args.concurrency
    if min(args.num_requests, args.concurrency, args.input_len, args.output_len,
           args.single_output_len) < 1 or args.single_requests < 0:  # fmt: skip
        p.error("sizes must be >= 1 (--single-requests >= 0)")
    try:
        workers = [int(x) for x in args.workers_list.split(",") if x.strip()]
    except ValueError:
        p.error(f"--workers-list: comma-separated integers, got {args.workers_list!r}")
    if any(x < 1 for x in workers):
        p.error("--workers-list: each must be >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)

    def on_sigterm(signum, _frame):  # let the finally blocks stop the servers
        raise KeyboardInterrupt(f"signal {signum}")

    old = signal.signal(signal.SIGTERM, on_sigterm)
    try:
        res = run_comparison(args, argv)
    finally:
        signal.signal(signal.SIGTERM, old)
    print(format_table(res), flush=True)
    if args.json:
        path = Path(args.json)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(bench_serving.jsonable(res), indent=1, allow_nan=False,
                                   default=str))  # fmt: skip
        print(f"wrote {path}")
    return 1 if any(r["status"] == "error" for r in res["rows"]) else 0


if __name__ == "__main__":
    sys.exit(main())
