"""The measured part of a run spread over several client processes (--client-processes K).

Why: one asyncio process streaming spends CPU on every SSE event (~45 µs a token with
aiohttp here; ~150 with httpx, whose httpcore, anyio and h11 are pure Python), so past
~15-20k tokens/s it saturates its core and measures itself rather than the server.

How: the parent (runner.py) builds the specs and schedule and does the warm-up; here
request i goes to spawned process i % K with its index and scheduled offset kept, and
process k gets max_concurrency // K (+1 for the first max_concurrency % K) slots. Each
process runs its own event loop and aiohttp session; once all are ready the parent picks one
t0 on perf_counter() (CLOCK_MONOTONIC on Linux: the same clock in every process), and they
submit against it and send back their requests' raw measurements, which the parent puts
back into its own `_Request`s, so the records and figures come out as from one process.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import queue
import sys
import time
from typing import Any

from benchmarks.serving.client import _Request
from benchmarks.serving.prompts import load_tokenizer
from benchmarks.serving.submit import http_client, submit_all

START_LEAD_S = 0.1  # t0 is this long after the last process reports ready
READY_TIMEOUT_S = 120.0  # spawning, importing, loading the tokenizer
FIELDS = (  # what a process measured of each request (plain, picklable values)
    "sent",
    "first",
    "end",
    "chunk_times",
    "usage_out",
    "usage_in",
    "error",
    "finished",
    "tokens_from",
)


def concurrency_share(max_concurrency: int | None, k: int, worker: int) -> int | None:
    """Process `worker`'s part of max_concurrency split over k processes (None: no limit)."""
    if max_concurrency is None:
        return None
    return max_concurrency // k + (1 if worker < max_concurrency % k else 0)


def run_in_processes(
    args: argparse.Namespace, url: str, model: str, reqs: list[_Request], k: int, bar=None
) -> tuple[float, float]:
    """Send `reqs` from k processes, filling in their measurements; returns (t0, duration).
    A process that fails raises RuntimeError here (the others are stopped)."""
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    go, start, done = ctx.Event(), ctx.Value("d", 0.0), ctx.Value("q", 0)
    procs: list[Any] = []
    ok = False
    try:
        for w in range(k):
            share = [(r.index, r.spec, r.scheduled_s) for r in reqs[w::k]]
            limit = concurrency_share(args.max_concurrency, k, w)
            p = ctx.Process(
                target=_worker,
                args=(w, args, url, model, share, limit, go, start, done, results),
                name=f"bench-client-{w}",
                daemon=True,
            )
            p.start()
            procs.append(p)
        _collect(procs, results, "ready", READY_TIMEOUT_S)
        t0 = time.perf_counter() + START_LEAD_S
        start.value = t0
        go.set()
        ends = _collect(procs, results, "done", None, bar, done)
        for w, (_, measured) in ends.items():
            for req, values in zip(reqs[w::k], measured):
                for name, value in zip(FIELDS, values):
                    setattr(req, name, value)
        if bar is not None:
            bar.update(len(reqs) - bar.n)
        ok = True
        return t0, max(end for end, _ in ends.values()) - t0
    finally:
        for p in procs:
            if ok:
                p.join(timeout=10)
            if p.is_alive():
                p.terminate()
                p.join()


def _collect(procs, results, kind: str, timeout_s: float | None, bar=None, done=None) -> dict:
    """Wait for one `kind` message from every process: {worker: payload}. Raises on an
    "error" message, on a process that exits without its message, or after timeout_s."""
    got: dict[int, Any] = {}
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    grace = None  # a dead process's message may still be in the pipe: wait a little for it
    while len(got) < len(procs):
        try:
            msg, w, payload = results.get(timeout=0.2)
        except queue.Empty:
            if bar is not None and done is not None:
                bar.update(done.value - bar.n)
            dead = [w for w, p in enumerate(procs) if w not in got and p.exitcode is not None]
            if dead and grace is None:
                grace = time.monotonic() + 2.0
            elif dead and time.monotonic() > grace:
                w = dead[0]
                raise RuntimeError(
                    f"client process {w} exited with code {procs[w].exitcode} before {kind} "
                    "(see its stderr; a script that runs the benchmark needs an "
                    "`if __name__ == '__main__':` guard, the processes are spawned)"
                ) from None
            if deadline is not None and time.monotonic() > deadline:
                raise RuntimeError(f"client processes not {kind} after {timeout_s} s") from None
            continue
        if msg == "error":
            raise RuntimeError(f"client process {w} failed: {payload}")
        if msg == kind:
            got[w] = payload
    return got


def _worker(w, args, url, model, share, limit, go, start, done, results) -> None:
    """One client process: load the tokenizer, open a client, report ready, wait for the
    start, send its requests against the shared t0 and send back (end, measurements)."""
    try:
        # send_request counts tokens only for --no-stream replies without usage
        tokenizer = load_tokenizer(args.tokenizer) if args.tokenizer and not args.stream else None
        reqs = [_Request(i, spec, off) for i, spec, off in share]
        end = asyncio.run(
            _run(w, args, url, model, reqs, tokenizer, limit, go, start, done, results)
        )
        measured = [tuple(getattr(r, name) for name in FIELDS) for r in reqs]
        results.put(("done", w, (end, measured)))
    except BaseException as e:  # SystemExit, KeyboardInterrupt too: the parent must hear
        import traceback

        traceback.print_exc(file=sys.stderr)
        results.put(("error", w, f"{type(e).__name__}: {e}"[:1000]))


async def _run(w, args, url, model, reqs, tokenizer, limit, go, start, done, results) -> float:
    def tick() -> None:
        with done.get_lock():
            done.value += 1

    async with http_client(args, len(reqs), limit) as client:
        results.put(("ready", w, None))
        if not go.wait(READY_TIMEOUT_S):  # nothing else runs on this loop yet: block
            raise RuntimeError("no start signal from the parent")
        return await submit_all(client, args, url, model, reqs, tokenizer, limit, start.value, tick)
