"""--stream-interval: throughput and the frontend's and detokenizer's CPU time, N = 1 vs 8.

    .venv/bin/python benchmarks/bench_stream_interval.py            # 64 streams, N = 1 and 8
    .venv/bin/python benchmarks/bench_stream_interval.py --intervals 1 4 8 --output-len 256

For each interval: start `launch.py --stream-interval N` (default model; other server
flags after `--`), wait until healthy, read the CPU seconds (user + system, from
/proc/<pid>/stat) of its frontend and detok processes, run bench_serving (64 streams at
once, ignore_eos, so every run produces the same tokens), read them again, stop the
server. Prints one row per interval: output tokens/s, mean ITL and TTFT as the client
saw them, SSE chunks per request, and the two processes' CPU seconds over the run. Run it
on an idle machine: the client, the server and its workers share the CPU.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from pathlib import Path

if __package__ in (None, ""):  # `python benchmarks/bench_stream_interval.py`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_serving import parse_args as bench_args
from benchmarks.comparison.process import (
    REPO,
    Process,
    child_processes,
    cpu_seconds,
    free_port,
    wait_idle,
)
from benchmarks.serving.runner import run_benchmark

WATCHED = {"frontend": "frontend", "detok": "detok_worker"}  # name -> `python -m` module


def children(launcher_pid: int) -> dict[str, int]:
    """WATCHED name -> pid, among launch.py's children (`python -m <module>`)."""
    modules = child_processes(launcher_pid)
    found = {name: modules[mod] for name, mod in WATCHED.items() if mod in modules}
    missing = set(WATCHED) - set(found)
    if missing:
        raise RuntimeError(f"launch.py (pid {launcher_pid}) has no {sorted(missing)} child")
    return found


def run_one(interval: int, args: argparse.Namespace, server_args: list[str]) -> dict:
    port = free_port()
    log = Path(tempfile.mkdtemp(prefix="zs-si-")) / f"server-{interval}.log"
    argv = [sys.executable, str(REPO / "launch.py"), "--port", str(port)]
    argv += ["--stream-interval", str(interval), *server_args]
    server = Process(argv, log, f"http://127.0.0.1:{port}")
    try:
        server.wait_healthy(args.startup_timeout)
        pids = children(server.proc.pid)
        bench = bench_args(
            [
                "--base-url",
                server.base_url,
                "--num-prompts",
                str(args.streams),
                "--input-len",
                str(args.input_len),
                "--output-len",
                str(args.output_len),
                "--warmup-requests",
                "2",
                "--disable-tqdm",
            ]
        )
        before = {name: cpu_seconds(pid) for name, pid in pids.items()}
        res = asyncio.run(run_benchmark(bench))
        after = {name: cpu_seconds(pid) for name, pid in pids.items()}
        wait_idle(server)
    finally:
        server.stop()
    ok = [r for r in res["requests"] if r["success"]]
    nan = float("nan")
    return {
        "interval": interval,
        "completed": res["completed"],
        "output_tokens_per_s": res["output_throughput"],
        "ttft_ms": res.get("mean_ttft_ms") or nan,
        "itl_ms": res.get("mean_itl_ms") or nan,
        "chunks_per_request": sum(r["num_chunks"] for r in ok) / max(1, len(ok)),
        **{f"{name}_cpu_s": after[name] - before[name] for name in WATCHED},
    }


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    server_args: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, server_args = argv[:cut], argv[cut + 1 :]
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--intervals", type=int, nargs="+", default=[1, 8])
    p.add_argument("--streams", type=int, default=64, help="requests, all at once")
    p.add_argument("--input-len", type=int, default=64)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--startup-timeout", type=float, default=300.0)
    args = p.parse_args(argv)
    rows = [run_one(n, args, server_args) for n in args.intervals]
    head = (
        f"{'N':>3} {'done':>5} {'out tok/s':>10} {'TTFT ms':>9} {'ITL ms':>8} "
        f"{'chunks/req':>10} {'frontend CPU s':>15} {'detok CPU s':>12}"
    )
    print(f"{args.streams} streams, {args.input_len} prompt / {args.output_len} output tokens")
    print(head)
    for r in rows:
        print(
            f"{r['interval']:>3} {r['completed']:>5} {r['output_tokens_per_s']:>10.1f} "
            f"{r['ttft_ms']:>9.1f} {r['itl_ms']:>8.1f} {r['chunks_per_request']:>10.1f} "
            f"{r['frontend_cpu_s']:>15.2f} {r['detok_cpu_s']:>12.2f}"
        )
    return 0 if all(r["completed"] == args.streams for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
