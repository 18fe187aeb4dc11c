"""Faults and bad input under load (issue 52): `streams` chat streams at once, sampled as
chat clients send them (temperature 0.7, top_p 0.9, a seed), `tokens` out (ignore_eos); a
third of them disconnect mid-stream, a tenth send an invalid sampling value (a 400 at
intake: nothing reaches the engine), one in eight asks for 20 top logprobs a token. The
others must all end whole, at speed: their tok/s against the same streams in a run
without the faults, just before (a ratio printed: a speed target lives in a benchmark's
figure, not in the verdict). Then, once idle, /metrics must show every KV block free and no
request running, waiting or in flight (nothing leaked by the aborted ones).

    python benchmarks/gpu/client_faults.py URL [--streams 256] [--tokens 128] [--out f.json]

Exit 0 when every check holds (verdict PASS), else 1. The CPU's e2e test runs it with few
streams (tests/e2e/test_fault_mix.py); the GPU check at 256 (stage faults_m135).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.comparison.metrics import parse_metrics  # noqa: E402

# one a tenth of the streams, in turn: each must come back a 400 naming its parameter
INVALID = [
    ({"temperature": -1}, "temperature"),
    ({"top_p": 1.5}, "top_p"),
    ({"logprobs": True, "top_logprobs": 25}, "top_logprobs"),
    ({"presence_penalty": 5}, "presence_penalty"),
    ({"n": 0}, "n"),
    ({"max_tokens": -5}, "max_tokens"),
    ({"frequency_penalty": -3}, "frequency_penalty"),
]
TOP = 20  # the logprobs streams' top_logprobs


def kind(i: int) -> str:
    if i % 10 == 9:
        return "invalid"
    if i % 3 == 1:
        return "disconnect"
    return "logprobs" if i % 8 == 3 else "plain"


def body(model: str, i: int, tokens: int) -> dict:
    b = {
        "model": model,
        "messages": [{"role": "user", "content": f"Story {i}: tell me about a lighthouse."}],
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_tokens": tokens,
        "ignore_eos": True,
        "temperature": 0.7,
        "top_p": 0.9,
        "seed": i,
    }
    if kind(i) == "logprobs":
        b |= {"logprobs": True, "top_logprobs": TOP}
    return b


async def one(c: httpx.AsyncClient, url: str, model: str, i: int, tokens: int, faults: bool):
    """A stream's record: how it ended, its tokens, its times, what was wrong with it."""
    k = "plain" if not faults and kind(i) == "disconnect" else kind(i)
    b = body(model, i, tokens)
    rec: dict = {"i": i, "kind": k, "start": time.perf_counter(), "tokens": 0, "bad": []}
    if k == "invalid":
        extra, param = INVALID[(i // 10) % len(INVALID)]
        r = await c.post(url + "/v1/chat/completions", json=b | extra)
        rec["end"] = time.perf_counter()
        err = (
            r.json().get("error", {})
            if r.headers.get("content-type", "").startswith("application/json")
            else {}
        )
        if r.status_code != 400 or err.get("param") != param or not err.get("message"):
            rec["bad"].append(f"want a 400 on {param}, got {r.status_code} {r.text[:160]}")
        return rec
    cut = 2 + i % 5  # a disconnecting stream's chunks before it goes
    chunks = 0
    async with c.stream("POST", url + "/v1/chat/completions", json=b) as s:
        if s.status_code != 200:
            rec["bad"].append(f"HTTP {s.status_code}")
            rec["end"] = time.perf_counter()
            return rec
        async for line in s.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            d = json.loads(line[6:])
            if "error" in d:
                rec["bad"].append(f"error event {str(d['error'])[:160]}")
                continue
            if d.get("usage"):
                rec["tokens"] = d["usage"]["completion_tokens"]
            for ch in d.get("choices", []):
                if ch.get("finish_reason"):
                    rec["finish"] = ch["finish_reason"]
                lps = (ch.get("logprobs") or {}).get("content") or []
                if k == "logprobs" and any(len(t.get("top_logprobs", [])) != TOP for t in lps):
                    rec["bad"].append("a token without its 20 top logprobs")
            if d.get("choices"):
                chunks += 1
                rec.setdefault("first", time.perf_counter())
            if k == "disconnect" and chunks >= cut:
                break  # the client goes: the server must abort it and free its blocks
    rec["end"] = time.perf_counter()
    if k != "disconnect" and (rec["tokens"] != tokens or rec.get("finish") != "length"):
        rec["bad"].append(f"ended with {rec['tokens']} tokens, finish {rec.get('finish')}")
    return rec


async def run(url: str, model: str, streams: int, tokens: int, faults: bool) -> list[dict]:
    limits = httpx.Limits(max_connections=streams + 4, max_keepalive_connections=streams + 4)
    timeout = httpx.Timeout(300.0, connect=30.0)
    # without the faults: the invalid ones not sent, the disconnecting ones run whole
    todo = [i for i in range(streams) if faults or kind(i) != "invalid"]
    async with httpx.AsyncClient(limits=limits, timeout=timeout, trust_env=False) as c:
        return await asyncio.gather(*(one(c, url, model, i, tokens, faults) for i in todo))


def served(recs: list[dict], kinds: tuple[str, ...]) -> dict:
    """The whole streams of `kinds` (as the faults' run has them: the same streams in both
    runs): tok/s over the run, median decode tok/s a stream."""
    whole = [r for r in recs if kind(r["i"]) in kinds and not r["bad"] and "first" in r]
    if not whole:
        return {"streams": 0}
    span = max(r["end"] for r in whole) - min(r["start"] for r in whole)
    decode = [(r["tokens"] - 1) / (r["end"] - r["first"]) for r in whole if r["end"] > r["first"]]
    return {
        "streams": len(whole),
        "tok_s": round(sum(r["tokens"] for r in whole) / span, 1),
        "decode_tok_s_median": round(statistics.median(decode), 2) if decode else None,
    }


def wait_idle(url: str, timeout_s: float) -> dict:
    """/metrics until nothing runs, waits or is in flight and every KV block is free."""
    deadline = time.monotonic() + timeout_s
    while True:
        m = parse_metrics(httpx.get(url + "/metrics", timeout=10, trust_env=False).text)
        keys = (
            "zeroserve:num_requests_running",
            "zeroserve:num_requests_waiting",
            "zeroserve:num_requests_in_flight",
        )
        figures = {k.split(":")[1]: m.get(k) for k in keys}
        free, total = (
            m.get("zeroserve:kv_cache_free_blocks"),
            m.get("zeroserve:kv_cache_total_blocks"),
        )
        idle = all(v == 0 for v in figures.values()) and free == total
        figures |= {"kv_free_blocks": free, "kv_total_blocks": total}
        if idle:
            return figures | {"idle": True}
        if time.monotonic() > deadline:
            return figures | {"idle": False}
        time.sleep(0.25)


def fault_mix(url: str, streams: int, tokens: int) -> dict:
    model = httpx.get(url + "/v1/models", timeout=30, trust_env=False).json()["data"][0]["id"]
    asyncio.run(run(url, model, min(streams, 8), 4, faults=False))  # warm: not counted
    clean = asyncio.run(run(url, model, streams, tokens, faults=False))
    recs = asyncio.run(run(url, model, streams, tokens, faults=True))
    res: dict = {"streams": streams, "tokens": tokens}
    res["kinds"] = {k: sum(r["kind"] == k for r in recs) for k in sorted({r["kind"] for r in recs})}
    res["problems"] = [f"{r['kind']} {r['i']}: {b}" for r in clean + recs for b in r["bad"]]
    kinds = ("plain", "logprobs")
    res["clean"], res["faults"] = served(clean, kinds), served(recs, kinds)
    if res["clean"].get("tok_s") and res["faults"].get("tok_s"):
        res["tok_s_ratio"] = round(res["faults"]["tok_s"] / res["clean"]["tok_s"], 3)
    invalid = [r["end"] - r["start"] for r in recs if r["kind"] == "invalid"]
    res["invalid_answer_s_max"] = round(max(invalid), 3) if invalid else None
    res["after"] = wait_idle(url, 30.0)
    ok = not res["problems"] and res["after"]["idle"]
    ok = ok and res["faults"].get("streams") == sum(k in kinds for k in map(kind, range(streams)))
    res["verdict"] = "PASS" if ok else "FAIL"
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("url")
    ap.add_argument("--streams", type=int, default=256)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    res = fault_mix(a.url.rstrip("/"), a.streams, a.tokens)
    print(
        f"fault mix, {a.streams} streams of {a.tokens} tokens ({res['kinds']}): whole streams' "
        f"tok/s {res['faults'].get('tok_s')} against {res['clean'].get('tok_s')} without the "
        f"faults (ratio {res.get('tok_s_ratio')}); invalid answered within "
        f"{res['invalid_answer_s_max']} s; idle after: {res['after']}; {res['verdict']}"
    )
    for p in res["problems"][:10]:
        print("  problem:", p)
    if a.out:
        Path(a.out).write_text(json.dumps(res, indent=1))
    return 0 if res["verdict"] == "PASS" else 1


if __name__ == "__main__":
    raise SystemExit(main())
