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
     both it and our engine, by default on the CPU, serve the file's own Q4_1/Q8_0
     blocks), `-np C -c C*ctx -t threads`, the same bench_serving loads; when
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

Per GGUF file (K-quants, other families), zeroserve against llama-server at 1 / 8 / 32
streams with a long-prompt TTFT, memory and start-up: benchmarks/compare_files.py.

Run it on an idle machine: another process on the cores moves these figures a lot (the
CPUs' busy share from other processes is sampled before and after the run and warned of).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
from pathlib import Path

if __package__ in (None, ""):  # `python benchmarks/compare.py`: make `benchmarks.` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import bench_serving
from benchmarks.comparison.checks import evaluate_checks
from benchmarks.comparison.metrics import busy_delta, parse_metrics
from benchmarks.comparison.row_llama import find_llama_server
from benchmarks.comparison.runner import run_comparison
from benchmarks.comparison.table import format_table

__all__ = [  # what tests and other scripts import from here
    "busy_delta",
    "evaluate_checks",
    "find_llama_server",
    "format_table",
    "main",
    "parse_args",
    "parse_metrics",
    "run_comparison",
]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--model", default="smollm2", help="as launch.py --model")
    p.add_argument(
        "--dtype",
        default="auto",
        choices=("auto", "float32", "bfloat16", "float16"),
        help="engine dtype (rows a-c)",
    )
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    p.add_argument(
        "--engine-args",
        default="",
        help="more launch.py engine flags for rows a-c, e.g. '--kv-cache-memory-gb 2'",
    )
    p.add_argument(
        "--num-requests", type=int, default=None, help="main-load requests (default: --concurrency)"
    )
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument(
        "--single-requests",
        type=int,
        default=10,
        help="one-at-a-time requests (distinct prompts) for TTFT and prefill",
    )
    p.add_argument("--single-output-len", type=int, default=16)
    p.add_argument("--workers-list", default="4,1", help="--tokenize-workers of each server row")
    p.add_argument("--skip-offline", action="store_true")
    p.add_argument("--skip-hf", action="store_true")
    p.add_argument("--hf-dtype", default="auto", choices=("auto", "float32", "bfloat16", "float16"))
    p.add_argument("--hf-batch", type=int, default=None, help="default: --concurrency")
    p.add_argument("--llama-server", help="llama.cpp's llama-server binary (default: on PATH)")
    p.add_argument("--gguf", help="GGUF for llama-server (default: the default model's)")
    p.add_argument(
        "--llama-threads",
        type=int,
        default=None,
        help="llama-server -t (default: torch's thread count, as our engine)",
    )
    p.add_argument(
        "--llama-ctx-per-slot",
        type=int,
        default=None,
        help="default: the longest prompt + output, rounded up to 256",
    )
    p.add_argument("--llama-args", default="", help="more llama-server flags")
    p.add_argument("--startup-timeout", type=float, default=300.0)
    p.add_argument("--request-timeout", type=float, default=1800.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log-dir", help="keep the servers' logs here (default: a temp dir)")
    p.add_argument("--json", help="write every figure, machine_info and the args here")
    args = p.parse_args(argv)
    if args.num_requests is None:
        args.num_requests = args.concurrency
    if (
        min(
            args.num_requests,
            args.concurrency,
            args.input_len,
            args.output_len,
            args.single_output_len,
        )
        < 1
        or args.single_requests < 0
    ):
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
        path.write_text(
            json.dumps(bench_serving.jsonable(res), indent=1, allow_nan=False, default=str)
        )
        print(f"wrote {path}")
    return 1 if any(r["status"] == "error" for r in res["rows"]) else 0


if __name__ == "__main__":
    sys.exit(main())
