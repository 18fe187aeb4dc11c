"""Soak: many mixed requests at high concurrency against one server of its own.

The mix (seeded, so every run sends the same requests): completions and chat, streaming
and not, 1-24 output tokens with ignore_eos (so the token count is known exactly); about
10% of the clients leave early (a stream closed after two chunks, or a non-streaming
request with a tiny client timeout), about 5% send a bad request.

Asserted: every good request completes with exactly its token count (no 5xx, no error
event, every stream ends with [DONE]); every bad one gets a 4xx OpenAI error; no request
outlives REQUEST_TIMEOUT_S (a hang counts as a failure); afterwards every KV block is
free, no process restarted, and the resident memory of each server process, sampled
through the run, does not keep growing (mean of the last third of the samples against
the first third).

It runs in every run of the suite (it was `-m slow`, and went red unseen).
"""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.conftest import served

REQUEST_TIMEOUT_S = 60.0  # no request of this mix may take longer: beyond it, a hang
RSS_INTERVAL_S = 0.25
MiB = 1 << 20
WORDS = [
    "river",
    "stone",
    "light",
    "garden",
    "winter",
    "music",
    "paper",
    "engine",
    "silver",
    "window",
    "forest",
    "market",
    "letter",
    "bridge",
    "candle",
    "harbor",
    "meadow",
    "signal",
    "thunder",
    "lantern",
]
BAD_REQUESTS = [  # (path, raw body, expected status)
    ("/v1/completions", b'{"prompt": "hi", "temperature": -1}', 400),
    ("/v1/completions", b'{"prompt": "hi", "max_tokens": 0}', 400),
    ("/v1/completions", b'{"prompt": "hi", "n": 99}', 400),
    ("/v1/completions", b'{"prompt": [49152]}', 400),
    ("/v1/completions", b'{"prompt": "hi", "model": "gpt-9"}', 404),
    ("/v1/chat/completions", b'{"messages": "hello"}', 400),
    ("/v1/chat/completions", b'{"messages": [{"role": "user"}]', 400),  # truncated JSON
    (
        "/v1/chat/completions",
        b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 9000}',
        400,
    ),
]


@dataclass
class Spec:
    i: int
    chat: bool
    stream: bool
    max_tokens: int
    action: str  # "normal" | "disconnect" | "bad"
    bad: tuple[str, bytes, int] | None = None

    def body(self) -> dict[str, Any]:
        rng = random.Random(self.i)
        text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 40)))
        body: dict[str, Any] = {
            "max_tokens": self.max_tokens,
            "ignore_eos": True,
            "temperature": rng.choice([0.0, 0.7, 1.0]),
            "seed": self.i,
        }
        if self.chat:
            body["messages"] = [{"role": "user", "content": f"Request {self.i}: {text}"}]
        else:
            body["prompt"] = f"Request {self.i}: {text}"
        if self.stream:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        return body


def make_specs(n: int, seed: int) -> list[Spec]:
    rng = random.Random(seed)
    specs = []
    for i in range(n):
        roll = rng.random()
        action = "bad" if roll < 0.05 else "disconnect" if roll < 0.15 else "normal"
        chat, stream = rng.random() < 0.5, rng.random() < 0.5
        # a client that leaves early asks for a long output, so it is cut while running
        max_tokens = 256 if action == "disconnect" else rng.randint(1, 24)
        bad = rng.choice(BAD_REQUESTS) if action == "bad" else None
        specs.append(Spec(i, chat, stream, max_tokens, action, bad))
    return specs


@dataclass
class Result:
    spec: Spec
    outcome: str  # "ok" | "left" | "rejected" | "failed"
    detail: str = ""
    seconds: float = 0.0


def _openai_error(text: str) -> bool:
    try:
        err = json.loads(text)["error"]
        return isinstance(err["message"], str) and isinstance(err["type"], str)
    except (ValueError, KeyError, TypeError):
        return False


async def run_one(client: httpx.AsyncClient, url: str, spec: Spec) -> Result:
    if spec.action == "bad":
        path, content, status = spec.bad
        r = await client.post(
            url + path, content=content, headers={"content-type": "application/json"}
        )
        if r.status_code == status and _openai_error(r.text):
            return Result(spec, "rejected")
        return Result(
            spec, "failed", f"bad request {content[:60]!r}: {r.status_code} {r.text[:200]}"
        )
    path = "/v1/chat/completions" if spec.chat else "/v1/completions"
    if spec.action == "disconnect" and not spec.stream:
        try:
            await client.post(url + path, json=spec.body(), timeout=0.3)
        except httpx.TimeoutException:
            return Result(spec, "left")
        return Result(spec, "failed", "a 256-token request answered within 0.3 s")
    if not spec.stream:
        r = await client.post(url + path, json=spec.body())
        if r.status_code != 200:
            return Result(spec, "failed", f"{r.status_code} {r.text[:300]}")
        out = r.json()
        got, finish = out["usage"]["completion_tokens"], out["choices"][0]["finish_reason"]
        if got != spec.max_tokens or finish != "length":
            return Result(spec, "failed", f"{got} tokens ({finish}), wanted {spec.max_tokens}")
        return Result(spec, "ok")
    async with client.stream("POST", url + path, json=spec.body()) as r:
        if r.status_code != 200:
            return Result(spec, "failed", f"{r.status_code} {(await r.aread())[:300]!r}")
        chunks, usage, done = 0, None, False
        async for line in r.aiter_lines():
            if not line.startswith("data: "):
                continue
            payload = line[len("data: ") :]
            if payload == "[DONE]":
                done = True
                break
            event = json.loads(payload)
            if "error" in event:
                return Result(spec, "failed", f"error event {payload[:300]}")
            chunks += 1
            usage = event.get("usage") or usage
            if spec.action == "disconnect" and chunks >= 2:
                return Result(spec, "left")  # leaving the block closes the connection
    if spec.action == "disconnect":
        return Result(spec, "failed", "a 256-token stream ended before its second chunk")
    if not done or usage is None or usage["completion_tokens"] != spec.max_tokens:
        return Result(
            spec, "failed", f"stream: [DONE] {done}, usage {usage}, wanted {spec.max_tokens} tokens"
        )
    return Result(spec, "ok")


async def run_all(url: str, specs: list[Spec], concurrency: int) -> list[Result]:
    sem = asyncio.Semaphore(concurrency)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(timeout=REQUEST_TIMEOUT_S, limits=limits) as client:

        async def bounded(spec: Spec) -> Result:
            async with sem:
                t0 = time.monotonic()
                try:
                    res = await asyncio.wait_for(run_one(client, url, spec), REQUEST_TIMEOUT_S)
                except TimeoutError:
                    res = Result(spec, "failed", f"no answer within {REQUEST_TIMEOUT_S:g} s (hang)")
                except httpx.HTTPError as e:
                    res = Result(spec, "failed", f"{type(e).__name__}: {e}")
                res.seconds = time.monotonic() - t0
                return res

        return await asyncio.gather(*(bounded(s) for s in specs))


# -- resident memory ----------------------------------------------------------------------------
def rss_bytes(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def process_name(pid: int) -> str:
    args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    name = args[args.index(b"-m") + 1].decode() if b"-m" in args else "?"
    return f"{name}[{pid}]"


@dataclass
class RSSSampler:
    pids: list[int]
    samples: dict[int, list[int]] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)

    def __enter__(self) -> RSSSampler:
        self.samples = {p: [] for p in self.pids}
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            for pid in self.pids:
                v = rss_bytes(pid)
                if v is not None:
                    self.samples[pid].append(v)
            self._stop.wait(RSS_INTERVAL_S)

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def thirds(self, pid: int) -> tuple[float, float]:
        s = self.samples[pid]
        k = len(s) // 3
        return statistics.fmean(s[:k]), statistics.fmean(s[-k:])


def scheduler_memory(metrics: dict[str, float]) -> dict[str, float]:
    """Replica 0's memory parts from /metrics: {part: bytes}."""
    head = 'zeroserve:scheduler_memory_bytes{engine="0",part="'
    return {k[len(head) : -2]: v for k, v in metrics.items() if k.startswith(head)}


# -- the soak -----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def soak_server(default_model_dir):
    yield from served(workers=2)


def soak(server, n: int, concurrency: int, seed: int, rss_slack: float, rss_slack_abs: int) -> None:
    pids = sorted(server.pids())
    # warm-up, not sampled: the allocators (glibc arenas, torch's buffers for every batch
    # shape up to the concurrency) reach their working set before the first third is taken
    warm = [Spec(-i - 1, i % 2 == 0, i % 3 == 0, 24, "normal") for i in range(concurrency * 2)]
    failed = [r for r in asyncio.run(run_all(server.url, warm, concurrency)) if r.outcome != "ok"]
    assert not failed, [(r.spec, r.detail) for r in failed[:5]]
    server.wait_idle(timeout_s=30)
    before = server.metrics()

    specs = make_specs(n, seed)
    t0 = time.monotonic()
    with RSSSampler(pids) as rss:
        results = asyncio.run(run_all(server.url, specs, concurrency))
    elapsed = time.monotonic() - t0
    idle = server.wait_idle(timeout_s=30)

    outcomes = Counter(r.outcome for r in results)
    tokens = sum(r.spec.max_tokens for r in results if r.outcome == "ok")
    latencies = sorted(r.seconds for r in results if r.outcome == "ok")
    aborted = idle.get('zeroserve:request_success_total{finished_reason="abort"}', 0) - before.get(
        'zeroserve:request_success_total{finished_reason="abort"}', 0
    )
    lines = [
        f"soak: {n} requests at concurrency {concurrency} in {elapsed:.1f} s = "
        f"{n / elapsed:.1f} req/s, {tokens / elapsed:.0f} generated tok/s (completed ones)",
        f"  outcomes {dict(outcomes)}; planned {dict(Counter(s.action for s in specs))}; "
        f"aborted at the engine {aborted:g}",
        f"  latency of completed requests: p50 {latencies[len(latencies) // 2]:.2f} s, "
        f"max {latencies[-1]:.2f} s",
    ]
    growth = {}
    for pid in pids:
        first, last = rss.thirds(pid)
        growth[pid] = (first, last)
        lines.append(
            f"  RSS {process_name(pid):>24}: first third {first / MiB:7.1f} MiB, "
            f"last third {last / MiB:7.1f} MiB ({(last - first) / MiB:+.1f} MiB, "
            f"{len(rss.samples[pid])} samples)"
        )
    # the scheduler's own account (scheduler_worker/memory_report.py), idle before and after:
    # KV pages first touched and the heap's kept step buffers are meant to grow; a leak is
    # what grows besides them
    mem0, mem1 = scheduler_memory(before), scheduler_memory(idle)
    delta = {k: mem1[k] - mem0[k] for k in mem0.keys() & mem1.keys()}
    explained = delta.get("kv_resident", 0.0) + delta.get("heap_kept_free", 0.0)
    unexplained = delta.get("resident", 0.0) - explained
    lines.append(
        "  scheduler, idle before -> after: "
        + ", ".join(f"{k} {mem0[k] / MiB:.1f} -> {mem1[k] / MiB:.1f} MiB" for k in sorted(delta))
        + f"; growth besides first-touched KV pages and kept heap: {unexplained / MiB:+.1f} MiB"
    )
    print("\n" + "\n".join(lines))

    failures = [(r.spec, r.detail) for r in results if r.outcome == "failed"]
    assert not failures, f"{len(failures)} failed, e.g. {failures[:5]}"
    assert outcomes["ok"] == sum(s.action == "normal" for s in specs)
    assert outcomes["rejected"] == sum(s.action == "bad" for s in specs)
    assert outcomes["left"] == sum(s.action == "disconnect" for s in specs)
    # the clients that left were aborted at the engine, not left to run their 256 tokens
    assert aborted >= 0.8 * outcomes["left"], (aborted, outcomes["left"])
    assert sorted(server.pids()) == pids, "a server process died or was restarted"
    assert {"resident", "kv_resident", "heap_in_use", "heap_kept_free"} <= mem1.keys(), mem1
    for pid, (first, last) in growth.items():
        allowed = max(first * rss_slack, rss_slack_abs)
        if process_name(pid).startswith("scheduler_worker"):
            # counted: the KV pages touched and the heap's kept buffers may grow, nothing
            # else (the heap's bytes in use included)
            assert unexplained <= allowed and delta["heap_in_use"] <= allowed, (
                f"the scheduler grew {unexplained / MiB:.1f} MiB besides first-touched KV "
                f"pages and the heap's kept buffers, its heap in use "
                f"{delta['heap_in_use'] / MiB:+.1f} MiB (allowed {allowed / MiB:.1f}): {lines[-1]}"
            )
            continue
        assert last - first <= allowed, (
            f"{process_name(pid)} RSS grew {(last - first) / MiB:.1f} MiB "
            f"(allowed {allowed / MiB:.1f}): {[round(s / MiB) for s in rss.samples[pid]]}"
        )


@pytest.mark.timeout(900)
def test_soak(soak_server):
    """1200 requests at concurrency 64 (about 40 s on 2 idle cores), in every run of the
    suite (it went red unseen while it was `-m slow`). +2% or +8 MiB between the first
    and the last third (a steady leak shows as 2/3 of its total growth there; measured:
    +0.1 to +1.7 MiB for every process but the scheduler); the scheduler, whose KV pages
    and kept heap grow by design (+215 MiB: 205 of first-touched KV pages, 9 of kept
    step buffers), by its own account: +0.7 MiB besides them."""
    soak(soak_server, n=1200, concurrency=64, seed=2, rss_slack=0.02, rss_slack_abs=8 * MiB)
