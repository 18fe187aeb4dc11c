"""zeroserve against llama.cpp's llama-server on each GGUF file given, one server after
the other on the same prompts (issue 21's table): output tok/s at 1 / 8 / 32 streams,
TTFT of a ~2,000-token prompt, the scheduler's resident memory beside the file's tensor
bytes, start-up time.

    LS=/tmp/llama.cpp/build/bin/llama-server
    .venv/bin/python benchmarks/compare_files.py --llama-server $LS \
        --file smollm2 --file /tmp/gguf/smollm2-135m-instruct-q4_k_m.gguf \
        --streams 1,8,32 --json bench_results/files.json

Per file (benchmarks/comparison/per_file.py): zeroserve with default flags
(`launch.py --model FILE`, plus --engine-args), then `llama-server -m FILE -np 32 -c
32*CTX -t THREADS` (CTX: the longest prompt + output, rounded up to 256; THREADS:
torch's, as our engine), each started once and measured at every stream count of
--streams (max(C, --min-requests) requests of --input-len tokens, --output-len out,
ignore_eos, streaming), then --long-requests prompts of --long-len tokens one at a time.
The tensor types of each file are read with gguf-py (benchmarks/comparison/gguf_types.py).
A file zeroserve refuses gets its error in the table and llama-server still runs.

Start-up is spawn -> /health 200 with a warm conversion cache (the prompts are cut with
the file's tokenizer, which converts the file once before either server starts).
Memory: VmRSS at the end of the runs and VmHWM (peak) of the scheduler processes
(zeroserve) or of llama-server (whose figure includes its KV cache of -np x CTX tokens,
allocated at start); any /metrics series named *weight* is printed beside the file's
tensor bytes. This is the per-file companion of benchmarks/compare.py (which compares the
default model's server with its offline engine, transformers and llama-server).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path

if __package__ in (None, ""):  # `python benchmarks/compare_files.py`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.comparison.file_table import format_files
from benchmarks.comparison.per_file import compare_file
from benchmarks.comparison.row_llama import find_llama_server
from benchmarks.comparison.runner import _git_commit, cpu_busy
from benchmarks.comparison.util import log


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--file",
        action="append",
        help="a GGUF file or the alias smollm2 (repeat for several; default: smollm2)",
    )
    p.add_argument("--llama-server", help="llama.cpp's llama-server (default: on PATH)")
    p.add_argument("--streams", default="1,8,32", help="stream counts, comma-separated")
    p.add_argument(
        "--min-requests", type=int, default=8, help="requests per stream count, at least"
    )
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--long-len", type=int, default=2000, help="tokens of the long prompts")
    p.add_argument("--long-requests", type=int, default=3)
    p.add_argument("--long-output-len", type=int, default=8)
    p.add_argument("--engine-args", default="", help="more launch.py flags (default: none)")
    p.add_argument("--llama-np", type=int, default=32, help="llama-server -np")
    p.add_argument("--threads", type=int, default=None, help="llama-server -t (default: torch's)")
    p.add_argument("--llama-args", default="", help="more llama-server flags")
    p.add_argument(
        "--llama-first",
        action="store_true",
        help="run llama-server before zeroserve on each file (alternate runs to even out drift)",
    )
    p.add_argument("--startup-timeout", type=float, default=600.0)
    p.add_argument("--request-timeout", type=float, default=1800.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log-dir", help="keep the servers' logs here (default: a temp dir)")
    p.add_argument("--json", help="write every figure here")
    args = p.parse_args(argv)
    args.file = args.file or ["smollm2"]
    try:
        args.stream_list = [int(x) for x in args.streams.split(",") if x.strip()]
    except ValueError:
        p.error(f"--streams: comma-separated integers, got {args.streams!r}")
    sizes = [*args.stream_list, args.input_len, args.output_len, args.long_output_len]
    if not args.stream_list or min(sizes) < 1 or args.long_requests < 0:
        p.error("stream counts and lengths must be >= 1 (--long-requests >= 0)")
    if max(args.stream_list) > args.llama_np:
        p.error(f"--llama-np {args.llama_np} is below the largest stream count")
    if args.threads is None:
        import torch

        args.threads = torch.get_num_threads()  # what our engine (torch's default) uses
    return args


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    from benchmarks.bench_engine import machine_info

    binary, why = find_llama_server(args)
    if binary is None:
        log(f"llama-server skipped: {why}")

    def on_sigterm(signum, _frame):  # let the finally blocks stop the servers
        raise KeyboardInterrupt(f"signal {signum}")

    old = signal.signal(signal.SIGTERM, on_sigterm)
    tmp = Path(tempfile.mkdtemp(prefix="zs-files-"))
    log_dir = Path(args.log_dir) if args.log_dir else tmp
    log_dir.mkdir(parents=True, exist_ok=True)
    busy_before = cpu_busy()
    load_before = os.getloadavg()
    files = []
    try:
        for i, spec in enumerate(args.file):
            files.append(compare_file(args, spec, binary, log_dir, tmp, f"f{i}"))
    finally:
        signal.signal(signal.SIGTERM, old)
        shutil.rmtree(tmp, ignore_errors=True)  # the logs too, unless --log-dir
    res = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "commit": _git_commit(),
        "machine": machine_info(),
        "argv": argv,
        "args": {k: v for k, v in vars(args).items()},
        "streams": args.stream_list,
        "workload": (
            f"per stream count C: max(C, {args.min_requests}) requests of {args.input_len} "
            f"tokens, {args.output_len} out (ignore_eos), at most C at once; "
            f"{args.long_requests} prompts of ~{args.long_len} tokens one at a time, "
            f"{args.long_output_len} out; llama-server -np {args.llama_np} -t {args.threads}"
        ),
        "cpu_busy_before": busy_before,
        "cpu_busy_after": cpu_busy(),
        "loadavg_before": load_before,  # 1, 5, 15 min, as `uptime` prints
        "loadavg_after": os.getloadavg(),
        "files": files,
    }
    print(format_files(res), flush=True)
    if args.json:
        path = Path(args.json)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(res, indent=1, default=str))
        print(f"wrote {path}")
    # a file zeroserve refuses is a figure of the table; a llama-server that fails is not
    return 1 if any(f["llama_server"].get("status") == "error" for f in files) else 0


if __name__ == "__main__":
    sys.exit(main())
