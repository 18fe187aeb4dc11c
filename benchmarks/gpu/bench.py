"""Streaming benchmark of a running server with the project's own client
(benchmarks/bench_serving.py), at several concurrencies, within a deadline.

    python bench.py URL TOKDIR ZSROOT OUT.json --conc 1,8,32,128 --factor 4 --min-n 8 \
        --deadline EPOCH [--max-num-seqs 64] [--smi-at 32] [--label m135]

Requests per level: max(min_n, factor * c), cut down (to whole waves of min(c,
max_num_seqs) requests, at least c) when the previous level's e2e latency says the level
would not end before the deadline; a level that cannot run c requests in time is skipped.
At --smi-at, nvidia-smi samples utilization and memory every 200 ms. With --server-pid
(launch.py's), each level records the CPU share (% of one core over the level's wall time)
of every server process and of the client (bench_serving and its client processes): the
process at ~100% is the cap. At --one-client-at C, level C runs a second time with one
client process (--client-processes 1), to show what the client's own core costs.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

if __package__ in (None, ""):  # `python benchmarks/gpu/bench.py`: the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.comparison.process import child_processes, cpu_seconds  # noqa: E402

KEEP = (
    "output_throughput",
    "total_token_throughput",
    "request_throughput",
    "completed",
    "failed",
    "num_requests",
    "duration_s",
    "total_input_tokens",
    "total_output_tokens",
    "median_ttft_ms",
    "p90_ttft_ms",
    "p99_ttft_ms",
    "mean_ttft_ms",
    "median_tpot_ms",
    "mean_tpot_ms",
    "p99_tpot_ms",
    "median_itl_ms",
    "p99_itl_ms",
    "median_e2el_ms",
    "max_e2el_ms",
    "max_concurrent_requests",
    "peak_output_throughput",
    "input_tokens_from_server",
    "errors",
)
SETTLE_S = 0.25  # after a level, before /metrics is read (the scheduler's idle beat)
IDLE_WAIT_S = 15.0  # at most this long for the engine to be idle after a level
METRICS = re.compile(
    r"^zeroserve:(scheduler_busy_seconds|generation_tokens|prompt_tokens|kv_cache_total_blocks"
    r"|model_weight_bytes|request_success|num_requests_running|num_requests_waiting)"
)


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def settled_metrics(url: str) -> tuple[list[str], bool]:
    """/metrics once the engine is idle: (lines, whether it was). The scheduler's figures
    there are those of its last status beat, which comes IDLE_BEAT_MS after the engine
    goes idle (scheduler_worker/worker.py); after a level that timed out, the engine may
    still be winding down the aborted streams. Before that beat (runs 1-3 of issue 38), a
    read right after a level missed up to a heartbeat (1 s) of its forwards."""
    deadline = time.time() + IDLE_WAIT_S
    while True:
        time.sleep(SETTLE_S)
        lines = metrics(url)
        busy = [
            ln
            for ln in lines
            if ln.startswith(("zeroserve:num_requests_running ", "zeroserve:num_requests_waiting "))
            and float(ln.rsplit(" ", 1)[1]) > 0
        ]
        if not busy or time.time() > deadline:
            return lines, not busy


def metrics(url: str) -> list[str]:
    try:
        text = httpx.get(url + "/metrics", timeout=5.0, trust_env=False).text
    except httpx.HTTPError as e:
        return [f"error {e!r}"]
    return [ln for ln in text.splitlines() if METRICS.match(ln)]


class Smi:
    """nvidia-smi sampling utilization and memory every 200 ms, each line stamped with the
    time it arrived, so the mean can be taken over the benchmark's own window (the client's
    start-up and the tail of the level left out)."""

    def __init__(self) -> None:
        self.samples: list[tuple[float, float, float]] = []  # (time, util %, MiB)
        self.raw: list[str] = []
        exe = shutil.which("nvidia-smi")
        self.proc = None
        if exe is None:
            return
        query = "--query-gpu=utilization.gpu,memory.used"
        self.proc = subprocess.Popen(
            [exe, query, "--format=csv,noheader,nounits", "-lms", "200"],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            if len(self.raw) < 5:
                self.raw.append(line.strip())
            parts = [p.strip() for p in line.split(",")]
            with contextlib.suppress(ValueError, IndexError):
                self.samples.append((time.time(), float(parts[0]), float(parts[1])))

    def stop(self, window: tuple[float, float] | None = None) -> dict | None:
        if self.proc is None:
            return None
        self.proc.terminate()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.thread.join(timeout=5)
        util = [u for _, u, _ in self.samples]
        mem = [m for _, _, m in self.samples]
        if not util:
            return {"samples": 0, "raw_head": self.raw}
        res: dict = {
            "samples": len(util),
            "util_mean_all": round(sum(util) / len(util), 1),
            "util_max": max(util),
            "mem_used_max_mib": max(mem),
        }
        inside = [u for t, u, _ in self.samples if window and window[0] <= t <= window[1]]
        # util_mean: over the benchmark's window where known, else over the whole level
        res["util_mean"] = round(sum(inside) / len(inside), 1) if inside else res["util_mean_all"]
        res["window_samples"] = len(inside)
        return res


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("url")
    ap.add_argument("tokdir")
    ap.add_argument("zsroot")
    ap.add_argument("out")
    ap.add_argument("--conc", default="1,8,32,128")
    ap.add_argument("--factor", type=float, default=4)
    ap.add_argument("--min-n", type=int, default=8)
    ap.add_argument("--deadline", type=float, required=True, help="epoch seconds")
    ap.add_argument("--max-num-seqs", type=int, default=128, help="for the time estimates")
    ap.add_argument("--smi-at", type=int, default=32)
    ap.add_argument("--server-pid", type=int, help="launch.py's pid: CPU shares per level")
    ap.add_argument("--one-client-at", type=int, help="run this level again, 1 client process")
    ap.add_argument(
        "--chat-at",
        default="",
        help="run these levels again with the chat mix (bench_serving --mix chat)",
    )
    ap.add_argument("--input-len", type=int, default=100)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--label", default="")
    ap.add_argument(
        "--hint-json",
        help="client.py check's output: its greedy request's time "
        "gives the first level's latency estimate",
    )
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="zsbench-")
    levels: dict[str, dict] = {}
    res = {"label": args.label, "levels": levels, "metrics_before": metrics(args.url)}
    prev_e2e_s: float | None = None  # previous level's median e2e latency
    prev_c = 1
    try:  # the check's greedy request (n tokens, logprobs on): seconds per token
        g = json.loads(Path(args.hint_json).read_text())["greedy"] if args.hint_json else {}
        if g.get("seconds") and g.get("returned"):
            prev_e2e_s = 1.2 * g["seconds"] / g["returned"] * args.output_len
            res["hint_e2e_s"] = round(prev_e2e_s, 2)
            log(
                f"first-level estimate from the check's greedy request: {prev_e2e_s:.1f}s a request"
            )
    except (OSError, ValueError, KeyError, TypeError):
        pass
    plan = [(int(x), "") for x in args.conc.split(",")]
    if args.one_client_at is not None and any(c == args.one_client_at for c, _ in plan):
        at = [c for c, _ in plan].index(args.one_client_at)
        plan.insert(at + 1, (args.one_client_at, "/1client"))
    for chat_c in (int(x) for x in args.chat_at.split(",") if x):
        if any(c == chat_c and not v for c, v in plan):  # right after its greedy level
            at = [(c, v) for c, v in plan].index((chat_c, ""))
            plan.insert(at + 1, (chat_c, "/chat"))
    for c, variant in plan:
        key = f"{c}{variant}"
        n = max(args.min_n, int(args.factor * c))
        per_wave = min(c, args.max_num_seqs)
        left = args.deadline - time.time()
        if prev_e2e_s is not None:
            # a bigger batch makes each step slower: scale the last latency by the batch ratio
            # (at most 3x) for the estimate
            wave_s = prev_e2e_s * min(3.0, max(1.0, (per_wave / max(1, prev_c)) ** 0.25)) + 1.0
            waves_fit = int((left - 5) // wave_s)
            need = math.ceil(c / per_wave)  # waves of the first c requests
            if waves_fit < need:
                log(f"c={c}: skipped ({left:.0f}s left, ~{wave_s:.1f}s a wave, {need} needed)")
                levels[key] = {"skipped": f"deadline ({left:.0f}s left, ~{wave_s:.1f}s/wave)"}
                continue
            n_fit = max(c, waves_fit * per_wave)
            if n_fit < n:
                log(f"c={c}: {n} requests cut to {n_fit} to meet the deadline")
                n = n_fit
        elif left < 10:
            levels[key] = {"skipped": f"deadline ({left:.0f}s left)"}
            continue
        elif levels:  # no latency from an earlier level (it failed): one wave only
            n = c
        out = os.path.join(work, f"c{c}{variant.replace('/', '-')}.json")
        cmd = [
            sys.executable,
            os.path.join(args.zsroot, "benchmarks", "bench_serving.py"),
            "--base-url",
            args.url,
            "--tokenizer",
            args.tokdir,
            "--dataset",
            "random",
            "--input-len",
            str(args.input_len),
            "--output-len",
            str(args.output_len),
            "--num-prompts",
            str(n),
            "--max-concurrency",
            str(c),
            "--seed",
            "0",
            "--timeout",
            "180",  # per request: a hung request fails instead of holding the level
            "--disable-tqdm",
            f"--label={args.label}-c{key}",
            "--json",
            out,
        ]
        if variant == "/1client":
            cmd += ["--client-processes", "1"]
        if variant == "/chat":  # sampling options as chat clients send them, outputs checked
            cmd += ["--mix", "chat"]
        smi = Smi() if c == args.smi_at else None
        t = time.time()
        timeout = max(5.0, args.deadline - t)
        if prev_e2e_s is None and levels:  # an earlier level gave no latency: keep time back
            timeout = max(5.0, 0.6 * timeout)
        elif prev_e2e_s is None:  # the first level: at most 40% of what is left
            timeout = max(5.0, 0.4 * timeout)
        log(f"c={key}: {n} requests, timeout {timeout:.0f}s")
        procs = child_processes(args.server_pid) if args.server_pid else {}
        cpu0 = {k: cpu_seconds(pid) for k, pid in procs.items()}
        client0 = children_cpu()
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
            rc, tail = p.returncode, (p.stdout + p.stderr)[-1500:]
        except subprocess.TimeoutExpired as e:
            rc = "timeout"
            so = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else e.stdout
            tail = (so or "")[-1500:]
        t_end = time.time()
        wall = t_end - t
        used = {"client": children_cpu() - client0}  # its start-up (imports, spawns) too
        for k, pid in procs.items():
            a, b = cpu0[k], cpu_seconds(pid)
            if a is not None and b is not None:
                used[k] = b - a
        full = json.loads(Path(out).read_text()) if os.path.isfile(out) else None
        window = None
        if full and full.get("duration_s"):  # the requests' own span: the end of the run
            window = (t_end - float(full["duration_s"]) - 0.3, t_end)
        gpu = smi.stop(window) if smi is not None else None
        entry: dict = {"requests": n, "rc": rc, "wall_s": round(wall, 1)}
        # over the requests' span where known (the server works inside it), else the wall
        span = float(full["duration_s"]) if full and full.get("duration_s") else wall
        entry["cpu_pct"] = {k: round(100.0 * v / span) for k, v in used.items()}
        if gpu is not None:
            entry["gpu"] = gpu
        if full:
            entry.update({k: full.get(k) for k in KEEP})
            prev_e2e_s = (full.get("median_e2el_ms") or 0) / 1000 or prev_e2e_s
            prev_c = per_wave
            n_ok = full.get("completed") or 0
            if n_ok:
                entry["avg_prompt_tokens"] = round((full.get("total_input_tokens") or 0) / n_ok, 1)
                entry["avg_output_tokens"] = round((full.get("total_output_tokens") or 0) / n_ok, 1)
        else:
            entry["tail"] = tail
        entry["metrics_after"], idle = settled_metrics(args.url)
        if not idle:  # the busy split over this level and the next is not the levels' own
            entry["metrics_not_idle"] = True
            log(f"c={key}: the engine was still busy {IDLE_WAIT_S:.0f} s after the level")
        levels[key] = entry
        log(
            f"c={key}: rc={rc} {wall:.1f}s out tok/s {entry.get('output_throughput')} "
            f"TTFT med {entry.get('median_ttft_ms')} ms TPOT med {entry.get('median_tpot_ms')} "
            f"ms ITL med {entry.get('median_itl_ms')} ms cpu% {entry['cpu_pct']} gpu {gpu}"
        )
        if rc != 0:
            log(tail)
        Path(args.out).write_text(json.dumps(res, indent=1))
    Path(args.out).write_text(json.dumps(res, indent=1))
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
