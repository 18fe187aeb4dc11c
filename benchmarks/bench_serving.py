"""Online serving benchmark: a load generator for any OpenAI-compatible HTTP server
(zeroserve, llama.cpp's llama-server, vLLM, ...).

    python benchmarks/bench_serving.py --base-url http://127.0.0.1:8000 \
        --num-prompts 32 --max-concurrency 16 --input-len 128 --output-len 64 \
        --tokenizer "$MODEL_DIR" --json bench_results/serving.json --plot serving.png

(our default model's directory, for --tokenizer: `.venv/bin/python -c "from
common.model_files.model_source import resolve_model; print(resolve_model('smollm2'))"`)

Load shapes (how requests are submitted):
  --request-rate inf (default)   every request at once
  --request-rate R [--burstiness B] [--seed S]
                                 Poisson arrivals, R requests/s on average (gamma-distributed
                                 gaps with shape B; B=1 is Poisson, B<1 burstier)
  --submit-interval-ms X         a fixed schedule: request i is submitted at t0 + i*X ms
                                 (absolute, so a late submission does not delay the rest)
  --max-concurrency N            at most N requests in flight (combines with the above;
                                 time spent waiting for a slot is not counted in latency)

Client processes: one Python process's HTTP stack (aiohttp) costs ~45 µs of CPU a streamed
token here (httpx, before, ~150), so past ~15-20k tokens/s a single client measures itself.
--client-processes K deals request
i to spawned process i % K (each its own event loop and aiohttp session, a K-th of
--max-concurrency, one shared start time) and merges their records. 0 (default) = auto: 1
below a concurrency of 16, else min(4, CPUs / 2, concurrency / 8); never above the
concurrency (--max-concurrency, or --num-prompts without one).

Prompts (--dataset):
  random   windows of a public-domain text (benchmarks/data/) of about --input-len tokens
           (±--range-ratio), counted with --tokenizer DIR (tokenizer.json, `tokenizers`)
           or, without one, approximated as 0.75 words per token
  fixed    --prompt repeated --num-prompts times
  jsonl    --dataset-path: lines {"prompt": "...", "output_len": N}, cycled in order

Every request asks for --output-len tokens (±--range-ratio) as max_tokens with
`ignore_eos: true` (so lengths are exact on servers that honour it; --no-ignore-eos for
servers that reject the field) and temperature 0.

Measured per request, with streaming (the default): TTFT (time to the first non-empty
content chunk), ITL (gaps between content chunks: a chunk can carry several tokens when
the server batches them), TPOT ((e2e - TTFT) / (output tokens - 1)) and e2e latency.
Output tokens come from the final `usage` chunk (stream_options.include_usage) or, if the
server sends none, from the number of content chunks. --no-stream measures e2e only.

The core is importable: `parse_args(argv)`, `await run_benchmark(args) -> dict`,
`format_results(result) -> str`, `main(argv) -> int`. Needs aiohttp; tqdm for the progress
bar, `tokenizers` for --tokenizer and matplotlib for --plot (`pip install -e .[bench]`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
from pathlib import Path

if __package__ in (None, ""):  # `python benchmarks/bench_serving.py`: make `benchmarks.` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.serving.client import RequestFailed, fetch_model, request_body, send_request
from benchmarks.serving.prompts import (
    DATA_DIR,
    DEFAULT_TEXT,
    WORDS_PER_TOKEN,
    Spec,
    build_specs,
    count_tokens,
    load_tokenizer,
    random_prompts,
)
from benchmarks.serving.report import MAX_ERRORS_SHOWN, format_results, jsonable, plot_results
from benchmarks.serving.runner import check_args, resolve_client_processes, run_benchmark
from benchmarks.serving.schedule import arrival_offsets
from benchmarks.serving.stats import (
    latency_stats,
    peak_concurrency,
    percentile,
    summarize,
    token_time_series,
)

__all__ = [  # the importable core (see above), with the parts' public names
    "DATA_DIR",
    "DEFAULT_TEXT",
    "ENDPOINTS",
    "MAX_ERRORS_SHOWN",
    "WORDS_PER_TOKEN",
    "RequestFailed",
    "Spec",
    "arrival_offsets",
    "build_specs",
    "check_args",
    "count_tokens",
    "fetch_model",
    "format_results",
    "jsonable",
    "latency_stats",
    "load_tokenizer",
    "main",
    "parse_args",
    "peak_concurrency",
    "percentile",
    "plot_results",
    "random_prompts",
    "request_body",
    "resolve_client_processes",
    "run_benchmark",
    "send_request",
    "summarize",
    "token_time_series",
]

ENDPOINTS = ("/v1/completions", "/v1/chat/completions")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    s = p.add_argument_group("server")
    s.add_argument("--base-url", default="http://127.0.0.1:8000")
    s.add_argument("--endpoint", default="/v1/completions", choices=ENDPOINTS)
    s.add_argument("--model", help="model name to send (default: the first id of GET /v1/models)")
    s.add_argument("--api-key", help="sent as 'Authorization: Bearer KEY'")
    s.add_argument(
        "--no-stream",
        dest="stream",
        action="store_false",
        help="non-streaming requests: e2e latency only",
    )
    s.add_argument(
        "--no-ignore-eos",
        dest="ignore_eos",
        action="store_false",
        help="do not send ignore_eos (for servers that reject the field)",
    )
    s.add_argument("--temperature", type=float, default=0.0)
    s.add_argument(
        "--mix",
        choices=("greedy", "chat"),
        default="greedy",
        help="chat: issue 52's chat mix of sampling options per request, each output checked "
        "(benchmarks/serving/mix.py; streaming)",
    )
    s.add_argument(
        "--extra-body",
        type=json.loads,
        default=None,
        metavar="JSON",
        help="fields merged into every request body, e.g. '{\"top_k\": 1}'",
    )
    s.add_argument("--timeout", type=float, default=3600.0, help="per-request timeout (s)")
    d = p.add_argument_group("prompts")
    d.add_argument("--dataset", choices=("random", "fixed", "jsonl"), default="random")
    d.add_argument(
        "--dataset-path",
        help="jsonl: the file; random: a text to cut (default: "
        "benchmarks/data/pride_and_prejudice_ch1-6.txt)",
    )
    d.add_argument(
        "--prompt",
        default="Write a short story about a lighthouse keeper.",
        help="fixed: the prompt",
    )
    d.add_argument("--tokenizer", help="dir with tokenizer.json (or the file) to count tokens")
    d.add_argument("--num-prompts", type=int, default=100)
    d.add_argument("--input-len", type=int, default=128)
    d.add_argument("--output-len", type=int, default=128)
    d.add_argument(
        "--range-ratio", type=float, default=0.0, help="lengths uniform in [len*(1-r), len*(1+r)]"
    )
    d.add_argument("--seed", type=int, default=0)
    ld = p.add_argument_group("load shape")
    ld.add_argument(
        "--request-rate",
        type=float,
        default=math.inf,
        help="requests/s with Poisson arrivals; inf = all at once",
    )
    ld.add_argument(
        "--burstiness",
        type=float,
        default=1.0,
        help="gamma shape of the arrival gaps (1 = Poisson)",
    )
    ld.add_argument(
        "--submit-interval-ms",
        type=float,
        default=None,
        help="submit request i at t0 + i*X ms (instead of --request-rate)",
    )
    ld.add_argument("--max-concurrency", type=int, default=None)
    ld.add_argument(
        "--warmup-requests",
        type=int,
        default=1,
        help="requests sent (and checked) before the measured run",
    )
    ld.add_argument(
        "--client-processes",
        type=int,
        default=0,
        metavar="K",
        help="client processes to send from (0 = auto): one Python HTTP client costs "
        "~100+ us of CPU a streamed token, so at high rates it measures itself",
    )
    o = p.add_argument_group("output")
    o.add_argument("--json", help="write every figure, the args and per-request records")
    o.add_argument("--plot", help="PNG with latency CDFs and output tokens/s (matplotlib)")
    o.add_argument("--label", help="a name for this run, kept in the JSON and the plot")
    o.add_argument(
        "--series-interval",
        type=float,
        default=1.0,
        help="bin width (s) of the tokens/s time series",
    )
    o.add_argument("--disable-tqdm", action="store_true")
    args = p.parse_args(argv)
    try:
        check_args(args)
    except ValueError as e:
        p.error(str(e))
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            print(
                "--plot needs matplotlib: pip install matplotlib  (or pip install -e '.[bench]')",
                file=sys.stderr,
            )
            return 2
    import aiohttp

    try:
        res = asyncio.run(run_benchmark(args))
    except (aiohttp.ClientError, TimeoutError) as e:
        print(f"error: {args.base_url}: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    except (RuntimeError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(format_results(res))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(jsonable(res), f, indent=1, allow_nan=False, default=str)
        print(f"wrote {args.json}")
    if args.plot:
        plot_results(res, args.plot)
        print(f"wrote {args.plot}")
    return 0 if res["completed"] else 1


if __name__ == "__main__":
    sys.exit(main())
