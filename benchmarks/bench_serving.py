"""Online serving benchmark: a load generator for any OpenAI-compatible HTTP server
(zeroserve, llama.cpp's llama-server, vLLM, ...).

    python benchmarks/bench_serving.py --base-url http://127.0.0.1:8000 \
        --num-prompts 32 --max-concurrency 16 --input-len 128 --output-len 64 \
        --tokenizer "$MODEL_DIR" --json bench_results/serving.json --plot serving.png

(our default model's directory, for --tokenizer: `.venv/bin/python -c "from
common.model_source import resolve_model; print(resolve_model('smollm2'))"`)

Load shapes (how requests are submitted):
  --request-rate inf (default)   every request at once
  --request-rate R [--burstiness B] [--seed S]
                                 Poisson arrivals, R requests/s on average (gamma-distributed
                                 gaps with shape B; B=1 is Poisson, B<1 burstier)
  --submit-interval-ms X         a fixed schedule: request i is submitted at t0 + i*X ms
                                 (absolute, so a late submission does not delay the rest)
  --max-concurrency N            at most N requests in flight (combines with the above;
                                 time spent waiting for a slot is not counted in latency)

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
`format_results(result) -> str`, `main(argv) -> int`. Needs httpx; tqdm for the progress
bar, `tokenizers` for --tokenizer and matplotlib for --plot (`pip install -e .[bench]`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import random
import re
import sys
import time
from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

DATA_DIR = Path(__file__).resolve().parent / "data"
DEFAULT_TEXT = DATA_DIR / "pride_and_prejudice_ch1-6.txt"
WORDS_PER_TOKEN = 0.75  # without a tokenizer: the usual "100 tokens ~ 75 English words"
ENDPOINTS = ("/v1/completions", "/v1/chat/completions")
MAX_ERRORS_SHOWN = 5


# -- arrival schedule ---------------------------------------------------------------------
def arrival_offsets(n: int, request_rate: float = math.inf, *, submit_interval_ms: float | None = None,
                    burstiness: float = 1.0, seed: int = 0) -> list[float]:  # fmt: skip
    """Submit times of n requests in seconds after the start, non-decreasing, first 0.

    A fixed interval gives i * interval; an infinite rate gives all zeros; a finite rate gives
    gaps drawn from a gamma distribution with mean 1/rate and shape `burstiness` (1 = the
    exponential gaps of a Poisson process), seeded."""
    if n <= 0:
        return []
    if submit_interval_ms is not None:
        if submit_interval_ms < 0:
            raise ValueError("submit interval must be >= 0")
        return [i * submit_interval_ms / 1000.0 for i in range(n)]
    if request_rate <= 0:
        raise ValueError("request rate must be > 0")
    if math.isinf(request_rate):
        return [0.0] * n
    if burstiness <= 0:
        raise ValueError("burstiness must be > 0")
    rng = random.Random(seed)
    theta = 1.0 / (request_rate * burstiness)  # gamma scale: mean gap = shape*scale = 1/rate
    out, t = [0.0], 0.0
    for _ in range(n - 1):
        t += rng.gammavariate(burstiness, theta)
        out.append(t)
    return out


# -- statistics ---------------------------------------------------------------------------
def percentile(values: list[float], p: float) -> float:
    """The p-th percentile (0..100) with linear interpolation, like numpy's default."""
    if not values:
        raise ValueError("percentile of no values")
    v = sorted(values)
    k = (len(v) - 1) * p / 100.0
    lo = math.floor(k)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)


def latency_stats(values_s: list[float]) -> dict[str, float | None]:
    """mean/median/p90/p99/min/max in milliseconds of values in seconds; None when empty."""
    keys = ("mean", "median", "p90", "p99", "min", "max")
    if not values_s:
        return dict.fromkeys(keys)
    ms = [x * 1000.0 for x in values_s]
    return {"mean": sum(ms) / len(ms), "median": percentile(ms, 50), "p90": percentile(ms, 90),
            "p99": percentile(ms, 99), "min": min(ms), "max": max(ms)}  # fmt: skip


def token_time_series(events: list[tuple[float, float]], duration_s: float,
                      interval_s: float = 1.0) -> dict[str, Any]:  # fmt: skip
    """Output tokens per second in bins of interval_s from events (time after start, tokens).
    t_s are the bins' starts; the last bin ends at duration_s (its rate uses its own width)."""
    n_bins = max(1, math.ceil(duration_s / interval_s - 1e-9))
    bins = [0.0] * n_bins
    for t, tokens in events:
        bins[min(max(int(t / interval_s), 0), n_bins - 1)] += tokens
    starts = [i * interval_s for i in range(n_bins)]
    widths = [interval_s] * n_bins
    widths[-1] = max(duration_s - starts[-1], 1e-3 * interval_s) if duration_s > 0 else interval_s
    return {"t_s": starts, "end_s": max(duration_s, starts[-1] + widths[-1]),
            "output_tokens_per_s": [b / w for b, w in zip(bins, widths)]}  # fmt: skip


def peak_concurrency(intervals: list[tuple[float, float]]) -> int:
    """The most intervals (start, end) open at once."""
    points = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals],
                    key=lambda x: (x[0], x[1]))  # fmt: skip
    cur = peak = 0
    for _, d in points:
        cur += d
        peak = max(peak, cur)
    return peak


def summarize(records: list[dict[str, Any]], duration_s: float,
              itls_s: list[float] | None = None) -> dict[str, Any]:  # fmt: skip
    """The result figures from per-request records (see `_Request.record`)."""
    ok = [r for r in records if r["success"]]
    failed = [r for r in records if not r["success"]]
    out_tokens = sum(r["output_tokens"] or 0 for r in ok)
    in_tokens = sum(_input_tokens(r) for r in ok)
    duration = max(duration_s, 1e-9)
    res: dict[str, Any] = {
        "num_requests": len(records),
        "completed": len(ok),
        "failed": len(failed),
        "duration_s": duration_s,
        "total_input_tokens": in_tokens,
        "total_output_tokens": out_tokens,
        "request_throughput": len(ok) / duration,
        "output_throughput": out_tokens / duration,
        "total_token_throughput": (in_tokens + out_tokens) / duration,
        "input_tokens_from_server": all(r["prompt_tokens"] is not None for r in ok),
    }
    groups = {
        "ttft": [r["ttft_s"] for r in ok if r["ttft_s"] is not None],
        "tpot": [r["tpot_s"] for r in ok if r["tpot_s"] is not None],
        "itl": list(itls_s or []),
        "e2el": [r["e2e_s"] for r in ok if r["e2e_s"] is not None],
    }
    for name, vals in groups.items():
        for k, v in latency_stats(vals).items():
            res[f"{k}_{name}_ms"] = v
    errors = Counter(r["error"] for r in failed)
    res["errors"] = [{"error": e, "count": c} for e, c in errors.most_common()]
    return res


def _input_tokens(r: dict[str, Any]) -> int:
    if r["prompt_tokens"] is not None:  # what the server counted (template, BOS included)
        return r["prompt_tokens"]
    return r["prompt_len"] or 0


# -- prompts ------------------------------------------------------------------------------
@dataclass
class Spec:
    prompt: str
    prompt_len: int | None  # local count (tokenizer) or estimate (words); None if unknown
    output_len: int


def load_tokenizer(path: str | Path):
    from tokenizers import Tokenizer

    p = Path(path).expanduser()
    if p.is_dir():
        p = p / "tokenizer.json"
    if not p.is_file():
        raise SystemExit(f"--tokenizer: no tokenizer.json at {p}")
    return Tokenizer.from_file(str(p))


def count_tokens(tokenizer, text: str) -> int:
    return len(tokenizer.encode(text, add_special_tokens=False).ids)


def _ranged(rng: random.Random, center: int, ratio: float) -> int:
    lo = max(1, int(center * (1 - ratio)))
    hi = max(lo, int(center * (1 + ratio)))
    return rng.randint(lo, hi)


def random_prompts(n: int, input_len: int, output_len: int, range_ratio: float, rng: random.Random,
                   tokenizer=None, text: str | None = None) -> list[Spec]:  # fmt: skip
    """Windows of the text starting at random tokens (or words), about input_len tokens long."""
    base = text if text is not None else DEFAULT_TEXT.read_text(encoding="utf-8")
    in_lens = [_ranged(rng, input_len, range_ratio) for _ in range(n)]
    out_lens = [_ranged(rng, output_len, range_ratio) for _ in range(n)]
    units_needed = max(in_lens) if tokenizer else math.ceil(max(in_lens) * WORDS_PER_TOKEN)

    def spans(t: str) -> list[tuple[int, int]]:
        if tokenizer is None:
            return [m.span() for m in re.finditer(r"\S+", t)]
        return [o for o in tokenizer.encode(t, add_special_tokens=False).offsets if o[1] > o[0]]

    corpus = base
    units = spans(corpus)
    if not units:
        raise ValueError("empty prompt text")
    if len(units) <= units_needed:  # a longer window than the text: repeat it
        corpus = "\n\n".join([base] * (units_needed // len(units) + 2))
        units = spans(corpus)
    specs = []
    for in_len, out_len in zip(in_lens, out_lens):
        k = in_len if tokenizer else max(1, round(in_len * WORDS_PER_TOKEN))
        start = rng.randrange(0, len(units) - k + 1)
        prompt = corpus[units[start][0] : units[start + k - 1][1]]
        plen = count_tokens(tokenizer, prompt) if tokenizer else round(k / WORDS_PER_TOKEN)
        specs.append(Spec(prompt, plen, out_len))
    return specs


def build_specs(args: argparse.Namespace, tokenizer=None) -> list[Spec]:
    rng = random.Random(args.seed)
    n = args.num_prompts
    if args.dataset == "random":
        text = Path(args.dataset_path).read_text(encoding="utf-8") if args.dataset_path else None
        return random_prompts(n, args.input_len, args.output_len, args.range_ratio, rng,
                              tokenizer, text)  # fmt: skip
    if args.dataset == "fixed":
        plen = count_tokens(tokenizer, args.prompt) if tokenizer else None
        return [Spec(args.prompt, plen, _ranged(rng, args.output_len, args.range_ratio))
                for _ in range(n)]  # fmt: skip
    if args.dataset == "jsonl":
        rows = []
        with open(args.dataset_path, encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                row = json.loads(line)
                if not isinstance(row, dict) or not isinstance(row.get("prompt"), str):
                    raise SystemExit(
                        f'{args.dataset_path}:{lineno}: expected {{"prompt": str, ...}}'
                    )
                rows.append(row)
        if not rows:
            raise SystemExit(f"{args.dataset_path}: no prompts")
        specs = []
        for i in range(n):
            row = rows[i % len(rows)]
            out_len = row.get("output_len")
            if out_len is None:
                out_len = _ranged(rng, args.output_len, args.range_ratio)
            plen = count_tokens(tokenizer, row["prompt"]) if tokenizer else None
            specs.append(Spec(row["prompt"], plen, int(out_len)))
        return specs
    raise SystemExit(f"unknown dataset {args.dataset!r}")


# -- HTTP ---------------------------------------------------------------------------------
class RequestFailed(Exception):
    pass


def _headers(args: argparse.Namespace) -> dict[str, str]:
    return {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}


def request_body(args: argparse.Namespace, model: str, spec: Spec) -> dict[str, Any]:
    body: dict[str, Any] = {"model": model, "max_tokens": spec.output_len,
                            "temperature": args.temperature, "stream": args.stream}  # fmt: skip
    if args.endpoint.endswith("/chat/completions"):
        body["messages"] = [{"role": "user", "content": spec.prompt}]
    else:
        body["prompt"] = spec.prompt
    if args.stream:
        body["stream_options"] = {"include_usage": True}
    if args.ignore_eos:
        body["ignore_eos"] = True
    body.update(args.extra_body or {})
    return body


async def fetch_model(client, args: argparse.Namespace) -> str:
    r = await client.get(args.base_url.rstrip("/") + "/v1/models", headers=_headers(args))
    if r.status_code != 200:
        raise RuntimeError(f"GET /v1/models: HTTP {r.status_code}: {r.text[:300]}")
    data = r.json().get("data") or []
    if not data:
        raise RuntimeError("GET /v1/models: no models listed; pass --model")
    return data[0]["id"]


def _content(choice: dict[str, Any], chat: bool, stream: bool) -> str:
    if not chat:
        return choice.get("text") or ""
    msg = choice.get("delta" if stream else "message") or {}
    return msg.get("content") or msg.get("reasoning_content") or msg.get("reasoning") or ""


def _error_text(obj: Any) -> str:
    err = obj.get("error") if isinstance(obj, dict) else obj
    if isinstance(err, dict):
        return str(err.get("message") or err)
    return str(err)


class _Request:
    """One request's measurements; times are perf_counter() values until `record`."""

    def __init__(self, index: int, spec: Spec, scheduled_s: float) -> None:
        self.index, self.spec, self.scheduled_s = index, spec, scheduled_s
        self.sent = self.first = self.end = None
        self.chunk_times: list[float] = []
        self.usage_out: int | None = None
        self.usage_in: int | None = None
        self.error: str | None = None
        self.finished = False
        self.tokens_from = "none"

    @property
    def output_tokens(self) -> int:
        if self.usage_out is not None:
            return self.usage_out
        return len(self.chunk_times)

    def itls(self) -> list[float]:
        return [b - a for a, b in zip(self.chunk_times, self.chunk_times[1:])]

    def events(self, t0: float) -> list[tuple[float, float]]:
        """(time after t0, tokens) for the time series: usage tokens spread over the chunks."""
        if self.error is not None or self.end is None:
            return []
        n = self.output_tokens
        if self.chunk_times:
            per = n / len(self.chunk_times)
            return [(t - t0, per) for t in self.chunk_times]
        return [(self.end - t0, float(n))] if n else []

    def record(self, t0: float) -> dict[str, Any]:
        ok = self.error is None and self.end is not None
        elapsed = self.end - self.sent if self.end is not None and self.sent is not None else None
        e2e = elapsed if ok else None
        ttft = self.first - self.sent if ok and self.first is not None else None
        out = self.output_tokens if ok else None
        tpot = (e2e - ttft) / (out - 1) if ttft is not None and out and out > 1 else None
        return {
            "index": self.index, "success": ok, "error": self.error,
            "scheduled_s": self.scheduled_s,
            "sent_s": None if self.sent is None else self.sent - t0,
            "end_s": None if self.end is None else self.end - t0,
            "ttft_s": ttft, "tpot_s": tpot, "e2e_s": e2e, "elapsed_s": elapsed,
            "output_tokens": out, "output_len": self.spec.output_len,
            "output_tokens_from": self.tokens_from,
            "prompt_tokens": self.usage_in, "prompt_len": self.spec.prompt_len,
            "num_chunks": len(self.chunk_times),
        }  # fmt: skip


async def send_request(client, args: argparse.Namespace, url: str, model: str, req: _Request,
                       tokenizer=None) -> None:  # fmt: skip
    """Send one request and fill in `req`; never raises (errors go to req.error)."""
    chat = args.endpoint.endswith("/chat/completions")
    body = request_body(args, model, req.spec)
    req.sent = time.perf_counter()
    try:
        if args.stream:
            async with client.stream("POST", url, json=body, headers=_headers(args)) as resp:
                if resp.status_code != 200:
                    text = (await resp.aread()).decode("utf-8", "replace")
                    raise RequestFailed(f"HTTP {resp.status_code}: {text[:300]}")
                done = False
                async for line in resp.aiter_lines():
                    if not line.startswith("data:"):
                        continue  # blank separators, ": comments", "event:" lines
                    payload = line[5:].strip()
                    now = time.perf_counter()
                    if payload == "[DONE]":
                        done = True
                        break
                    obj = json.loads(payload)
                    if "error" in obj:
                        raise RequestFailed(f"error in stream: {_error_text(obj)}"[:400])
                    usage = obj.get("usage")
                    if usage:
                        req.usage_out = usage.get("completion_tokens", req.usage_out)
                        req.usage_in = usage.get("prompt_tokens", req.usage_in)
                    for choice in obj.get("choices") or []:
                        if _content(choice, chat, True):
                            if req.first is None:
                                req.first = now
                            req.chunk_times.append(now)
                        if choice.get("finish_reason") is not None:
                            req.finished = True
                if not (done or req.finished):
                    raise RequestFailed("stream ended without [DONE] or a finish_reason")
                req.tokens_from = "usage" if req.usage_out is not None else "chunks"
        else:
            resp = await client.post(url, json=body, headers=_headers(args))
            if resp.status_code != 200:
                raise RequestFailed(f"HTTP {resp.status_code}: {resp.text[:300]}")
            obj = resp.json()
            if "error" in obj:
                raise RequestFailed(_error_text(obj)[:400])
            usage = obj.get("usage") or {}
            req.usage_in = usage.get("prompt_tokens")
            req.usage_out = usage.get("completion_tokens")
            if req.usage_out is not None:
                req.tokens_from = "usage"
            else:
                text = "".join(_content(c, chat, False) for c in obj.get("choices") or [])
                req.usage_out = count_tokens(tokenizer, text) if tokenizer else 0
                req.tokens_from = "tokenizer" if tokenizer else "none"
        req.end = time.perf_counter()
    except RequestFailed as e:
        req.error = str(e)
    except Exception as e:  # transport errors, bad JSON, timeouts: a failed request
        req.error = f"{type(e).__name__}: {e}"[:400] if str(e) else type(e).__name__
    if req.error is not None:
        req.end = time.perf_counter()


async def _sleep_until(target: float) -> None:
    """Sleep until perf_counter() >= target (never wakes early)."""
    while (now := time.perf_counter()) < target:
        await asyncio.sleep(target - now)


async def run_benchmark(args: argparse.Namespace) -> dict[str, Any]:
    """Run the benchmark described by `args` (from `parse_args`) and return every figure,
    the per-request records and the time series."""
    import httpx

    check_args(args)
    tokenizer = load_tokenizer(args.tokenizer) if args.tokenizer else None
    specs = build_specs(args, tokenizer)
    offsets = arrival_offsets(len(specs), args.request_rate,
                              submit_interval_ms=args.submit_interval_ms,
                              burstiness=args.burstiness, seed=args.seed + 1)  # fmt: skip
    n_conn = max(1, min(args.max_concurrency or len(specs), len(specs)))
    limits = httpx.Limits(max_connections=n_conn + 1, max_keepalive_connections=n_conn + 1)
    timeout = httpx.Timeout(args.timeout, connect=min(args.timeout, 60.0))
    url = args.base_url.rstrip("/") + args.endpoint
    async with httpx.AsyncClient(limits=limits, timeout=timeout) as client:
        model = args.model or await fetch_model(client, args)
        for i in range(args.warmup_requests):  # not counted; fails fast on a wrong setup
            spec = specs[i % len(specs)]
            w = _Request(-1, Spec(spec.prompt, spec.prompt_len, min(spec.output_len, 16)), 0.0)
            await send_request(client, args, url, model, w, tokenizer)
            if w.error is not None:
                raise RuntimeError(f"warm-up request to {url} failed: {w.error}")

        sem = asyncio.Semaphore(args.max_concurrency) if args.max_concurrency else None
        bar = _progress(len(specs), args.disable_tqdm)
        reqs = [_Request(i, s, off) for i, (s, off) in enumerate(zip(specs, offsets))]

        async def one(req: _Request) -> None:
            async with sem if sem is not None else contextlib.nullcontext():
                await send_request(client, args, url, model, req, tokenizer)
            if bar is not None:
                bar.update(1)

        t0 = time.perf_counter()
        tasks = []
        for req in reqs:
            await _sleep_until(t0 + req.scheduled_s)
            tasks.append(asyncio.create_task(one(req)))
        await asyncio.gather(*tasks)
        duration = time.perf_counter() - t0
        if bar is not None:
            bar.close()

    records = [r.record(t0) for r in reqs]
    itls = [x for r in reqs if r.error is None for x in r.itls()]
    result = summarize(records, duration, itls if args.stream else None)
    spans = [(r["sent_s"], r["end_s"]) for r in records if r["end_s"] is not None]
    result["max_concurrent_requests"] = peak_concurrency(spans)
    events = [e for r in reqs for e in r.events(t0)]
    result["time_series"] = token_time_series(events, duration, args.series_interval)
    series = result["time_series"]["output_tokens_per_s"]
    result["peak_output_throughput"] = max(series) if series else 0.0
    result["config"] = {
        "base_url": args.base_url, "endpoint": args.endpoint, "model": model,
        "stream": args.stream, "ignore_eos": args.ignore_eos, "dataset": args.dataset,
        "request_rate": args.request_rate, "burstiness": args.burstiness,
        "submit_interval_ms": args.submit_interval_ms, "max_concurrency": args.max_concurrency,
        "label": args.label,
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }  # fmt: skip
    result["args"] = {**vars(args), "api_key": "***" if args.api_key else None}
    result["requests"] = records
    return result


def jsonable(v: Any) -> Any:
    """v with non-finite floats as strings ("inf"), so json.dump writes strict JSON."""
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    if isinstance(v, dict):
        return {k: jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [jsonable(x) for x in v]
    return v


def _progress(total: int, disable: bool):
    if disable:
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, desc="requests", unit="req", file=sys.stderr)


# -- output -------------------------------------------------------------------------------
def format_results(res: dict[str, Any]) -> str:
    w = 50
    lines = ["{s:{c}^{n}}".format(s=" Serving Benchmark Result ", n=w, c="=")]

    def row(label: str, value: Any, fmt: str = "") -> None:
        text = "n/a" if value is None else format(value, fmt)
        lines.append(f"{label:<40} {text:<10}")

    cfg = res.get("config", {})
    row("Successful requests:", res["completed"])
    row("Failed requests:", res["failed"])
    if cfg:
        rate = cfg["request_rate"]
        if cfg.get("submit_interval_ms") is not None:
            row("Submit interval (ms):", cfg["submit_interval_ms"], ".1f")
        else:
            row("Request rate (req/s):", "inf" if math.isinf(rate) else f"{rate:g}")
        row("Maximum request concurrency:", cfg["max_concurrency"] or "none")
    if "max_concurrent_requests" in res:
        row("Peak concurrent requests:", res["max_concurrent_requests"])
    row("Benchmark duration (s):", res["duration_s"], ".2f")
    suffix = "" if res.get("input_tokens_from_server", True) else " (est.)"
    row(f"Total input tokens{suffix}:", res["total_input_tokens"])
    row("Total generated tokens:", res["total_output_tokens"])
    row("Request throughput (req/s):", res["request_throughput"], ".2f")
    row("Output token throughput (tok/s):", res["output_throughput"], ".2f")
    if "peak_output_throughput" in res:
        row("Peak output token throughput (tok/s):", res["peak_output_throughput"], ".2f")
    row("Total token throughput (tok/s):", res["total_token_throughput"], ".2f")
    titles = {"ttft": ("Time to First Token", "TTFT"),
              "tpot": ("Time per Output Token (excl. 1st token)", "TPOT"),
              "itl": ("Inter-token Latency", "ITL"), "e2el": ("End-to-end Latency", "E2EL")}  # fmt: skip
    for key, (title, short) in titles.items():
        if res.get(f"mean_{key}_ms") is None:
            continue
        lines.append("{s:{c}^{n}}".format(s=title, n=w, c="-"))
        for stat, name in (("mean", "Mean"), ("median", "Median"), ("p90", "P90"), ("p99", "P99")):
            row(f"{name} {short} (ms):", res[f"{stat}_{key}_ms"], ".2f")
    lines.append("=" * w)
    if res["errors"]:
        lines.append(f"Errors ({res['failed']} failed requests; first {MAX_ERRORS_SHOWN} kinds):")
        for e in res["errors"][:MAX_ERRORS_SHOWN]:
            lines.append(f"  [{e['count']}x] {e['error']}")
    return "\n".join(lines)


def plot_results(res: dict[str, Any], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in res["requests"] if r["success"]]
    fig, axes = plt.subplots(2, 2, figsize=(11, 8))
    for ax, (key, title) in zip(axes.flat, (("ttft_s", "TTFT"), ("tpot_s", "TPOT"),
                                            ("e2e_s", "End-to-end latency"))):  # fmt: skip
        vals = sorted(r[key] * 1000.0 for r in ok if r[key] is not None)
        if vals:
            ax.step(vals, [(i + 1) / len(vals) for i in range(len(vals))], where="post")
        else:
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
        ax.set(title=f"{title} CDF", xlabel="ms", ylabel="fraction of requests", ylim=(0, 1.02))
        ax.grid(alpha=0.3)
    ax = axes.flat[3]
    ts = res["time_series"]
    ax.stairs(ts["output_tokens_per_s"], [*ts["t_s"], ts["end_s"]], fill=True, alpha=0.6)
    ax.set(title="Output tokens/s over time", xlabel="s since start", ylabel="tokens/s")
    ax.grid(alpha=0.3)
    cfg = res.get("config", {})
    fig.suptitle(f"{cfg.get('label') or cfg.get('model', '')}  {cfg.get('base_url', '')}"
                 f"{cfg.get('endpoint', '')}  {res['completed']} ok / {res['failed']} failed")  # fmt: skip
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# -- command line -------------------------------------------------------------------------
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    s = p.add_argument_group("server")
    s.add_argument("--base-url", default="http://127.0.0.1:8000")
    s.add_argument("--endpoint", default="/v1/completions", choices=ENDPOINTS)
    s.add_argument("--model", help="model name to send (default: the first id of GET /v1/models)")
    s.add_argument("--api-key", help="sent as 'Authorization: Bearer KEY'")
    s.add_argument("--no-stream", dest="stream", action="store_false",
                   help="non-streaming requests: e2e latency only")  # fmt: skip
    s.add_argument("--no-ignore-eos", dest="ignore_eos", action="store_false",
                   help="do not send ignore_eos (for servers that reject the field)")  # fmt: skip
    s.add_argument("--temperature", type=float, default=0.0)
    s.add_argument("--extra-body", type=json.loads, default=None, metavar="JSON",
                   help="fields merged into every request body, e.g. '{\"top_k\": 1}'")  # fmt: skip
    s.add_argument("--timeout", type=float, default=3600.0, help="per-request timeout (s)")
    d = p.add_argument_group("prompts")
    d.add_argument("--dataset", choices=("random", "fixed", "jsonl"), default="random")
    d.add_argument("--dataset-path", help="jsonl: the file; random: a text to cut (default: "
                                          "benchmarks/data/pride_and_prejudice_ch1-6.txt)")  # fmt: skip
    d.add_argument("--prompt", default="Write a short story about a lighthouse keeper.",
                   help="fixed: the prompt")  # fmt: skip
    d.add_argument("--tokenizer", help="dir with tokenizer.json (or the file) to count tokens")
    d.add_argument("--num-prompts", type=int, default=100)
    d.add_argument("--input-len", type=int, default=128)
    d.add_argument("--output-len", type=int, default=128)
    d.add_argument("--range-ratio", type=float, default=0.0,
                   help="lengths uniform in [len*(1-r), len*(1+r)]")  # fmt: skip
    d.add_argument("--seed", type=int, default=0)
    ld = p.add_argument_group("load shape")
    ld.add_argument("--request-rate", type=float, default=math.inf,
                    help="requests/s with Poisson arrivals; inf = all at once")  # fmt: skip
    ld.add_argument("--burstiness", type=float, default=1.0,
                    help="gamma shape of the arrival gaps (1 = Poisson)")  # fmt: skip
    ld.add_argument("--submit-interval-ms", type=float, default=None,
                    help="submit request i at t0 + i*X ms (instead of --request-rate)")  # fmt: skip
    ld.add_argument("--max-concurrency", type=int, default=None)
    ld.add_argument("--warmup-requests", type=int, default=1,
                    help="requests sent (and checked) before the measured run")  # fmt: skip
    o = p.add_argument_group("output")
    o.add_argument("--json", help="write every figure, the args and per-request records")
    o.add_argument("--plot", help="PNG with latency CDFs and output tokens/s (matplotlib)")
    o.add_argument("--label", help="a name for this run, kept in the JSON and the plot")
    o.add_argument("--series-interval", type=float, default=1.0,
                   help="bin width (s) of the tokens/s time series")  # fmt: skip
    o.add_argument("--disable-tqdm", action="store_true")
    args = p.parse_args(argv)
    try:
        check_args(args)
    except ValueError as e:
        p.error(str(e))
    return args


def check_args(args: argparse.Namespace) -> None:
    if args.num_prompts < 1:
        raise ValueError("--num-prompts must be >= 1")
    if args.input_len < 1 or args.output_len < 1:
        raise ValueError("--input-len and --output-len must be >= 1")
    if not 0 <= args.range_ratio < 1:
        raise ValueError("--range-ratio must be in [0, 1)")
    if args.submit_interval_ms is not None and not math.isinf(args.request_rate):
        raise ValueError("--submit-interval-ms and --request-rate are exclusive")
    if args.submit_interval_ms is not None and args.submit_interval_ms < 0:
        raise ValueError("--submit-interval-ms must be >= 0")
    if args.request_rate <= 0 or args.burstiness <= 0:
        raise ValueError("--request-rate and --burstiness must be > 0")
    if args.max_concurrency is not None and args.max_concurrency < 1:
        raise ValueError("--max-concurrency must be >= 1")
    if args.dataset == "jsonl" and not args.dataset_path:
        raise ValueError("--dataset jsonl needs --dataset-path")
    if args.series_interval <= 0:
        raise ValueError("--series-interval must be > 0")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            print("--plot needs matplotlib: pip install matplotlib  (or pip install -e '.[bench]')",
                  file=sys.stderr)  # fmt: skip
            return 2
    import httpx

    try:
        res = asyncio.run(run_benchmark(args))
    except httpx.HTTPError as e:
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
