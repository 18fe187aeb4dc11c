"""Fault injection against launch.py: SIGKILL each component kind during 16 concurrent
streams. Every stream ends (completed, or an error event / a cut connection) within
END_WITHIN_S of the kill, none hangs; the service then serves new requests; KV blocks
return to idle. And a SIGTERM drain: requests in flight finish, new ones get 503, every
process exits.

The time limits hold on a loaded 2-core machine and still tell the mechanisms apart: a
closed connection is noticed at once, a silent component after its liveness window
(3 s here), and a request nobody fails waits out the request timeout (600 s)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import threading
import time

import httpx
import pytest

from tests.e2e.conftest import served, start_server
from tests.frontend.sse import parse_sse

pytestmark = pytest.mark.timeout(300)
N_STREAMS = 16
END_WITHIN_S = 15.0  # five liveness windows; the streams end within a second when unloaded
NOTICED_WITHIN_S = 2.5  # a dead scheduler / detok turns /health 503 before its window lapses
DRAIN_S = 150  # test_sigterm_drains: 4 x 120 tokens take ~5 s unloaded, 30 s+ when loaded


@pytest.fixture(scope="module")
def faulty(default_model_dir):
    yield from served(workers=2)


def component_pid(server, module: str) -> int:
    out = subprocess.run(
        ["pgrep", "-f", "--", f"-m {module} --config {server.run_dir}"],
        capture_output=True,
        text=True,
    )
    pids = [int(p) for p in out.stdout.split()]
    assert pids, f"no {module} process"
    return pids[0]


async def one_stream(
    client: httpx.AsyncClient,
    url: str,
    i: int,
    started: asyncio.Event,
    counter: list[int],
    max_tokens: int,
) -> tuple[str, float]:
    """-> (outcome, monotonic end time); outcome "done", "error" or "cut"."""
    body = {
        "prompt": f"Stream {i}: tell a long story.",
        "max_tokens": max_tokens,
        "stream": True,
        "ignore_eos": True,
    }
    outcome = "cut"
    try:
        async with client.stream("POST", url + "/v1/completions", json=body) as r:
            if r.status_code != 200:
                return "error", time.monotonic()
            first = True
            async for line in r.aiter_lines():
                if not line.startswith("data: "):
                    continue
                if first:
                    first = False
                    counter[0] += 1
                    if counter[0] == N_STREAMS:
                        started.set()
                payload = line[len("data: ") :]
                if payload == "[DONE]":
                    return outcome if outcome == "error" else "done", time.monotonic()
                if "error" in json.loads(payload):
                    outcome = "error"
    except httpx.HTTPError:
        pass
    return outcome, time.monotonic()


def streams_under_fault(server, kill, max_tokens: int = 400) -> tuple[list[str], float]:
    """Start N_STREAMS streams; once all are producing, run kill(); gather outcomes."""

    async def main():
        started, counter = asyncio.Event(), [0]
        async with httpx.AsyncClient(
            timeout=httpx.Timeout(60, read=30), limits=httpx.Limits(max_connections=64)
        ) as client:
            tasks = [
                asyncio.ensure_future(
                    one_stream(client, server.url, i, started, counter, max_tokens)
                )
                for i in range(N_STREAMS)
            ]
            await asyncio.wait_for(started.wait(), 60)
            killed_at = time.monotonic()
            kill()
            results = await asyncio.gather(*tasks)
        return [o for o, _ in results], max(t for _, t in results) - killed_at

    return asyncio.run(main())


def recovered(server, timeout_s: float = 90.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if httpx.get(server.url + "/health", timeout=5).status_code == 200:
                break
        except httpx.TransportError:  # a restarting frontend: the port is closed a moment
            pass
        assert time.monotonic() < deadline, "service did not come back"
        time.sleep(0.2)
    for i in range(3):
        r = httpx.post(
            server.url + "/v1/completions",
            timeout=60,
            json={"prompt": f"After the fault {i}", "max_tokens": 5, "ignore_eos": True},
        )
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] == 5
    server.wait_idle(timeout_s=15)


class HealthWatch(threading.Thread):
    """Polls /health every 20 ms; `first_503_after(t)`: when it first answered 503 after t."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url, self.seen, self.stop = url, [], threading.Event()

    def run(self) -> None:
        with httpx.Client(timeout=2) as client:
            while not self.stop.is_set():
                with contextlib.suppress(httpx.HTTPError):
                    self.seen.append((time.monotonic(), client.get(self.url).status_code))
                time.sleep(0.02)

    def first_503_after(self, t: float) -> float | None:
        return next((at - t for at, status in self.seen if at >= t and status == 503), None)


@pytest.mark.parametrize("module", ["tokenizer_worker", "detok_worker", "scheduler_worker"])
def test_sigkill_during_streams(faulty, module):
    victim = component_pid(faulty, module)
    # streams past the tokenizers run to their end, so keep them short in that case
    max_tokens = 8 if module == "tokenizer_worker" else 400
    killed_at: list[float] = []

    def kill() -> None:
        # the launcher is paused so that it does not replace the victim at once: /health
        # must show the hole by itself, not only within the restart's split second
        faulty.proc.send_signal(signal.SIGSTOP)
        killed_at.append(time.monotonic())
        os.kill(victim, signal.SIGKILL)

    health = HealthWatch(faulty.url + "/health")
    health.start()
    try:
        outcomes, last_end = streams_under_fault(faulty, kill, max_tokens)
        if module != "tokenizer_worker":  # until /health shows the hole (or surely won't)
            deadline = killed_at[0] + 2 * NOTICED_WITHIN_S
            while health.first_503_after(killed_at[0]) is None and time.monotonic() < deadline:
                time.sleep(0.05)
    finally:
        health.stop.set()
        health.join()
        faulty.proc.send_signal(signal.SIGCONT)
    if module != "tokenizer_worker":  # its connection closing tells the frontend at once
        turned = health.first_503_after(killed_at[0])
        assert turned is not None and turned < NOTICED_WITHIN_S, (
            f"/health turned 503 after {turned} s"
        )
    assert len(outcomes) == N_STREAMS
    assert last_end <= END_WITHIN_S, f"a stream ended {last_end:.1f} s after the kill"
    if module == "tokenizer_worker":  # the streams were past the tokenizers: unaffected
        assert outcomes == ["done"] * N_STREAMS
    else:  # the component held them: each one ends with an error event, never silently
        assert set(outcomes) == {"error"}, outcomes
    recovered(faulty)


def test_sigkill_frontend_during_streams(faulty):
    victim = component_pid(faulty, "frontend")
    outcomes, last_end = streams_under_fault(faulty, lambda: os.kill(victim, signal.SIGKILL))
    assert set(outcomes) == {"cut"} and last_end <= END_WITHIN_S
    recovered(faulty)  # includes: the dead frontend's requests were aborted, blocks idle


def open_streams(server, n: int, body: dict) -> tuple[list[threading.Thread], list]:
    """n streamed completions of `body` (ignore_eos), each read by a thread that appends
    (status, text) to the returned list; returns once all n streams have started (their
    headers came, which the server sends with the first output)."""
    results: list = []
    started = threading.Semaphore(0)
    body = {**body, "stream": True, "ignore_eos": True}

    def stream() -> None:
        with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=60) as r:
            started.release()
            results.append((r.status_code, r.read().decode()))

    threads = [threading.Thread(target=stream) for _ in range(n)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 60
    for _ in range(n):
        assert started.acquire(timeout=max(0.0, deadline - time.monotonic())), (
            "the streams did not all start"
        )
    return threads, results


@pytest.mark.parametrize("everyone", [False, True], ids=["launcher", "all-at-once"])
def test_sigterm_drains(default_model_dir, everyone):
    """SIGTERM to launch.py (it stops the frontend first), or to every process at the same
    moment as supervisord does: either way the requests in flight run to their end."""
    # a drain timeout that the four streams cannot outlast on a loaded machine
    server = start_server("--drain-timeout", str(DRAIN_S), workers=1)
    try:
        # long enough that the drain is still under way when the late request comes, even
        # on a fast machine (a short drain ends, the frontend exits, and "late" is refused)
        threads, results = open_streams(server, 4, {"prompt": "Drain me.", "max_tokens": 120})
        children = server.pids()
        if everyone:  # like supervisord: one SIGTERM to each program, no one restarts them
            server.proc.send_signal(signal.SIGSTOP)
            for pid in children:
                os.kill(pid, signal.SIGTERM)
        else:
            server.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 10
        while httpx.get(server.url + "/health", timeout=5).status_code != 503:  # draining
            assert time.monotonic() < deadline, "the frontend did not start draining"
            time.sleep(0.05)
        late = httpx.post(server.url + "/v1/completions", json={"prompt": "late"}, timeout=10)
        assert results == []  # the premise: the drain was still running when "late" came
        assert late.status_code == 503 and late.json()["error"]["code"] == "shutting_down"
        assert httpx.get(server.url + "/health", timeout=5).status_code == 503
        for t in threads:
            t.join(timeout=DRAIN_S)
        if everyone:
            deadline = time.monotonic() + 30
            while any(os.path.exists(f"/proc/{p}") and _state(p) != "Z" for p in children):
                assert time.monotonic() < deadline, "workers did not exit after draining"
                time.sleep(0.1)
            server.proc.send_signal(signal.SIGTERM)
            server.proc.send_signal(signal.SIGCONT)
        assert server.proc.wait(timeout=60) == 0
    finally:
        if server.proc.poll() is None:
            server.proc.kill()
    assert len(results) == 4
    for status, body in results:  # every request in flight ran to its end
        *events, done = parse_sse(body)  # (the text itself may say "error": parse, not grep)
        assert status == 200 and done == "[DONE]"
        assert not any("error" in e for e in events), body[-300:]
        assert events[-1]["choices"][0]["finish_reason"] == "length"
    assert server.pids() == []


def test_drain_timeout_fails_what_is_left_with_an_error_event(default_model_dir):
    """SIGTERM with streams that outlast --drain-timeout: each one still ends properly,
    with an SSE error event and [DONE] (not a cut connection), and everything exits 0."""
    server = start_server("--drain-timeout", "1", workers=1)
    try:
        threads, results = open_streams(server, 3, {"prompt": "Never done.", "max_tokens": 3000})
        server.proc.send_signal(signal.SIGTERM)
        for t in threads:
            t.join(timeout=30)
        assert server.proc.wait(timeout=60) == 0
    finally:
        if server.proc.poll() is None:
            server.proc.kill()
    assert len(results) == 3
    for status, body in results:
        *events, done = parse_sse(body)
        assert status == 200 and done == "[DONE]", body[-300:]
        assert events[-1]["error"]["code"] == "shutdown", body[-300:]
    assert server.pids() == []


def test_requests_in_a_dead_tokenizers_pipe_fail_fast(faulty):
    """A tokenizer that stops (SIGSTOP, then SIGKILL) strands the requests queued in its
    pipe: they fail with 503 within a few seconds; the others are served."""
    out = subprocess.run(
        ["pgrep", "-f", "--", f"-m tokenizer_worker --config {faulty.run_dir}"],
        capture_output=True,
        text=True,
    )
    pids = [int(p) for p in out.stdout.split()]
    assert len(pids) == 2
    victim = pids[0]
    os.kill(victim, signal.SIGSTOP)
    try:

        async def main():
            async with httpx.AsyncClient(timeout=30) as client:

                async def one(i: int):
                    t0 = time.monotonic()
                    r = await client.post(
                        faulty.url + "/v1/completions",
                        json={"prompt": f"Pipe {i}", "max_tokens": 4, "ignore_eos": True},
                    )
                    return r.status_code, r.json(), time.monotonic() - t0

                return await asyncio.gather(*(one(i) for i in range(8)))

        results = asyncio.run(main())
    finally:
        os.kill(victim, signal.SIGKILL)
        os.kill(victim, signal.SIGCONT)
    statuses = sorted(s for s, _, _ in results)
    assert 200 in statuses and 503 in statuses, statuses  # round-robin fed both workers
    for status, body, elapsed in results:
        if status == 503:
            assert body["error"]["code"] == "component_failed"
            assert elapsed < END_WITHIN_S, f"a stranded request took {elapsed:.1f} s to fail"
        else:
            assert status == 200 and body["usage"]["completion_tokens"] == 4
    recovered(faulty)


def _state(pid: int) -> str:
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"
