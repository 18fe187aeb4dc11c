"""The first request after /health against the steady ones: is there a compile stall?

python client.py first URL OUT.json [--steady 8] [--max-tokens 8]
    right after /health answers 200: one streaming completion (~100 prompt tokens), its
    TTFT; then --steady more, one at a time, each a prompt of its own (no prefix-cache
    hit), their median TTFT. Passes when the first is within 2x of that median and every
    request streamed its max_tokens tokens.
"""

from __future__ import annotations

import json
import statistics
import time

import httpx
from client_util import dump, log

WORDS = [
    "the",
    "a",
    "model",
    "server",
    "token",
    "stream",
    "batch",
    "cache",
    "graph",
    "kernel",
    "warm",
    "cold",
    "start",
]
RATIO_LIMIT = 2.0


def prompt(k: int) -> str:
    """~100 tokens, distinct from its first word on (no shared prefix between requests)."""
    return " ".join(f"{k}-{WORDS[(k + i) % len(WORDS)]}" for i in range(40))


def one(c: httpx.Client, url: str, k: int, max_tokens: int) -> dict:
    body = {
        "prompt": prompt(k),
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    t0 = time.perf_counter()
    ttft, tokens = None, None
    with c.stream("POST", url + "/v1/completions", json=body) as r:
        if r.status_code != 200:
            return {"error": f"HTTP {r.status_code}: {r.read()[:300]!r}"}
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if ttft is None and event.get("choices"):
                ttft = time.perf_counter() - t0
            if event.get("usage"):
                tokens = event["usage"].get("completion_tokens")
    total = time.perf_counter() - t0
    return {"ttft_ms": None if ttft is None else round(ttft * 1e3, 2),
            "total_ms": round(total * 1e3, 2), "tokens": tokens}  # fmt: skip


def first(url: str, out: str, steady: int = 8, max_tokens: int = 8) -> int:
    with httpx.Client(timeout=120.0, trust_env=False) as c:
        runs = [one(c, url, k, max_tokens) for k in range(steady + 1)]
    errors = [r["error"] for r in runs if "error" in r]
    ttfts = [r.get("ttft_ms") for r in runs[1:] if r.get("ttft_ms") is not None]
    res: dict = {"first": runs[0], "steady": runs[1:], "errors": errors}
    first_ms = runs[0].get("ttft_ms")
    res["steady_median_ttft_ms"] = med = statistics.median(ttfts) if ttfts else None
    res["ratio"] = round(first_ms / med, 2) if first_ms and med else None
    res["all_tokens"] = all(r.get("tokens") == max_tokens for r in runs)
    res["ok"] = bool(
        not errors and res["ratio"] is not None and res["ratio"] <= RATIO_LIMIT
        and res["all_tokens"]
    )  # fmt: skip
    log(f"first request TTFT {first_ms} ms, steady median {med} ms, ratio {res['ratio']} "
        f"(<= {RATIO_LIMIT}: {'PASS' if res['ok'] else 'FAIL'}); tokens all "
        f"{max_tokens}: {res['all_tokens']}; errors {errors[:2]}")  # fmt: skip
    dump(res, out)
    return 0 if res["ok"] else 1
