"""Data parallelism on this machine: `launch.py --dp 2` against `--dp 1`, through HTTP.

    python benchmarks/bench_dp.py [--json out.json] [--streams 64] [--output-len 128]

Three figures, each from one run here (ratios within a run; the machine is shared):

  throughput  --streams streams x --output-len tokens, all at once: --dp 2 (cores // 2
              threads each) vs --dp 1 (all cores): output tokens/s ratio, TTFT p50 of each
  balance     --dp 2, --balance-requests Poisson arrivals (--balance-rate /s): requests per
              replica (from /stats), max / min
  prefixes    8 long system prompts x 16 users each, interleaved: the prefix-cache hit rate
              (hits / queries, in tokens, from /metrics) with --dp 1, --dp 2 (least loaded
              with prefix affinity) and --dp 2 --routing round_robin

The load is benchmarks/bench_serving.py's (temperature 0, ignore_eos, streaming).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):  # `python benchmarks/bench_dp.py`: make `benchmarks.` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx

from benchmarks.bench_serving import parse_args as serving_args
from benchmarks.serving.prompts import DEFAULT_TEXT
from benchmarks.serving.runner import run_benchmark

REPO = Path(__file__).resolve().parents[1]
P = "zeroserve:"


class Server:
    def __init__(self, *flags: str) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.dir = Path(tempfile.mkdtemp(prefix="zs-bench-dp-"))
        self.log = self.dir / "log"
        args = [sys.executable, str(REPO / "launch.py"), "--port", str(self.port)]
        args += ["--run-dir", str(self.dir / "run"), "--num-kv-blocks", "2048", *flags]
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(args, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 300
        while "zeroserve ready:" not in self.log.read_text(errors="replace"):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(self.log.read_text(errors="replace")[-3000:])
            time.sleep(0.3)
        self.url = f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=120)
        shutil.rmtree(self.dir, ignore_errors=True)

    def metrics(self) -> dict[str, float]:
        out = {}
        for line in httpx.get(self.url + "/metrics", timeout=10).text.splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                out[name] = float(value)
        return out

    def tokens_by_replica(self) -> dict[str, int]:
        stats = httpx.get(self.url + "/stats", timeout=10).json()
        return {r["id"]: r["output_tokens_total"] for r in stats["replicas"]}

    def load(self, *argv: str) -> dict:
        args = serving_args(["--base-url", self.url, "--disable-tqdm", *argv])
        return asyncio.run(run_benchmark(args))


def throughput(server: Server, streams: int, output_len: int) -> dict:
    res = server.load(
        *("--num-prompts", str(streams), "--output-len", str(output_len), "--input-len", "64")
    )
    return {
        "output_tokens_per_s": round(res["output_throughput"], 1),
        "ttft_p50_ms": round(res["median_ttft_ms"], 1),
        "failed": res["failed"],
    }


def balance(server: Server, num: int, rate: float) -> dict:
    before = server.tokens_by_replica()
    server.load(
        *("--num-prompts", str(num), "--output-len", "16", "--input-len", "64"),
        *("--request-rate", str(rate), "--seed", "7"),
    )
    after = server.tokens_by_replica()
    per = {k: (after[k] - before.get(k, 0)) // 16 for k in after}
    return {
        "requests_per_replica": per,
        "max_over_min": round(max(per.values()) / max(1, min(per.values())), 3),
    }


def prefixes(server: Server, path: Path) -> float:
    before = server.metrics()
    server.load(
        *("--dataset", "jsonl", "--dataset-path", str(path), "--num-prompts", "128"),
        *("--max-concurrency", "16", "--output-len", "8"),
    )
    after = server.metrics()
    q = after[P + "prefix_cache_queries_total"] - before[P + "prefix_cache_queries_total"]
    h = after[P + "prefix_cache_hits_total"] - before[P + "prefix_cache_hits_total"]
    return round(h / q, 4) if q else 0.0


def prefix_dataset(path: Path) -> None:
    """8 system prompts of ~1,500 characters, 16 users each, interleaved."""
    words = DEFAULT_TEXT.read_text().split()
    systems = [" ".join(words[i * 300 : i * 300 + 250]) for i in range(8)]
    with open(path, "w") as f:
        for user in range(16):
            for i, system in enumerate(systems):
                prompt = f"System {i}: {system}\nUser {user}: what happens next, in brief?"
                f.write(json.dumps({"prompt": prompt, "output_len": 8}) + "\n")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--streams", type=int, default=64)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--balance-requests", type=int, default=200)
    p.add_argument("--balance-rate", type=float, default=8.0)
    p.add_argument("--json")
    args = p.parse_args(argv)
    cores = len(os.sched_getaffinity(0))
    data = Path(tempfile.mkdtemp(prefix="zs-bench-dp-data-")) / "prefixes.jsonl"
    prefix_dataset(data)
    out: dict = {"cores": cores, "cpu": _cpu_name(), "date": time.strftime("%Y-%m-%d")}
    runs = [
        ("dp1", ["--dp", "1", "--threads", str(cores)]),
        ("dp2", ["--dp", "2", "--threads", str(max(1, cores // 2))]),
        ("dp2_round_robin", ["--dp", "2", "--routing", "round_robin"]),
    ]
    for name, flags in runs:
        server = Server(*flags)
        try:
            if name != "dp2_round_robin":
                out[f"throughput_{name}"] = throughput(server, args.streams, args.output_len)
            if name == "dp2":
                out["balance_dp2"] = balance(server, args.balance_requests, args.balance_rate)
            out[f"prefix_hit_rate_{name}"] = prefixes(server, data)
        finally:
            server.stop()
        print(name, {k: v for k, v in out.items() if name in k}, flush=True)
    t1, t2 = out["throughput_dp1"], out["throughput_dp2"]
    out["throughput_ratio_dp2_over_dp1"] = round(
        t2["output_tokens_per_s"] / t1["output_tokens_per_s"], 3
    )
    out["prefix_hit_rate_ratio_dp2_over_dp1"] = round(
        out["prefix_hit_rate_dp2"] / max(out["prefix_hit_rate_dp1"], 1e-9), 3
    )
    print(json.dumps(out, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))
    shutil.rmtree(data.parent, ignore_errors=True)
    return 0


def _cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown"


if __name__ == "__main__":
    sys.exit(main())
