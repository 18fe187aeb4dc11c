"""Sending a run's measured requests from one process: its HTTP client, and each request
at t0 + its scheduled offset under the concurrency limit. Used by runner.py (one client
process) and workers.py (each of several), below both."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time
from collections.abc import Callable

from benchmarks.serving.client import _Request, send_request


async def _sleep_until(target: float) -> None:
    """Sleep until perf_counter() >= target (never wakes early)."""
    while (now := time.perf_counter()) < target:
        await asyncio.sleep(target - now)


def http_client(args: argparse.Namespace, n_requests: int, max_concurrency: int | None):
    """The aiohttp.ClientSession of one process: a connection per request it may have in
    flight; --timeout bounds each request whole. aiohttp (vLLM's benchmark client too): its
    C parser costs ~45 µs of CPU a streamed token where httpx cost ~150 (docs/benchmarks.md)."""
    import aiohttp

    n_conn = max(1, min(max_concurrency or n_requests, n_requests))
    connector = aiohttp.TCPConnector(limit=n_conn + 1)
    timeout = aiohttp.ClientTimeout(total=args.timeout, connect=min(args.timeout, 60.0))
    # no proxy from the environment: the server under test is where --base-url says
    return aiohttp.ClientSession(connector=connector, timeout=timeout, trust_env=False)


async def submit_all(
    client,
    args: argparse.Namespace,
    url: str,
    model: str,
    reqs: list[_Request],
    tokenizer,
    max_concurrency: int | None,
    t0: float,
    on_done: Callable[[], None] | None = None,
) -> float:
    """Send each request at t0 + its scheduled_s (at most max_concurrency in flight) and
    wait for all; returns perf_counter() at the end."""
    sem = asyncio.Semaphore(max_concurrency) if max_concurrency else None

    async def one(req: _Request) -> None:
        async with sem if sem is not None else contextlib.nullcontext():
            await send_request(client, args, url, model, req, tokenizer)
        if on_done is not None:
            on_done()

    tasks = []
    for req in reqs:
        await _sleep_until(t0 + req.scheduled_s)
        tasks.append(asyncio.create_task(one(req)))
    await asyncio.gather(*tasks)
    return time.perf_counter()
