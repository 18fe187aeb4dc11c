"""Several frontend processes on one port (`launch.py --api-servers 2`): every request
gets its own outputs whichever frontend accepted it, tokenizer calls are answered,
/metrics and /stats sum both frontends' requests, a /v1/responses chain finds its previous response
whichever frontend each call reaches, and a frontend killed with -9 costs only its own
streams: the other serves on, the launcher restarts it, the replica aborts its orphans."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import time

import httpx
import openai
import pytest

from tests.e2e.conftest import served

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def two(default_model_dir):
    yield from served("--api-servers", "2", workers=2)


def frontend_pids(server) -> dict[int, int]:
    """frontend id -> pid, from the launcher's command lines."""
    out = subprocess.run(
        ["pgrep", "-af", "--", f"-m frontend --config {server.run_dir}"],
        capture_output=True,
        text=True,
    ).stdout
    pids = {}
    for line in out.splitlines():
        m = re.search(r"--frontend-id (\d+)", line)
        if m:
            pids[int(m.group(1))] = int(line.split()[0])
    return pids


def metrics_pids(server) -> set[int]:
    """The pids with per-request metrics files: the frontends that served a request."""
    path = server.run_dir / "frontends" / "prometheus"
    return {int(m.group(1)) for n in os.listdir(path) if (m := re.match(r"\w+_(\d+)\.db$", n))}


async def complete(url: str, prompt: str, max_tokens: int, stream: bool) -> str:
    """One completion on a connection of its own (so the kernel picks its frontend)."""
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0, "stream": stream}
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        if not stream:
            r = await client.post("/v1/completions", json=body)
            r.raise_for_status()
            return r.json()["choices"][0]["text"]
        text = ""
        async with client.stream("POST", "/v1/completions", json=body) as r:
            r.raise_for_status()
            async for line in r.aiter_lines():
                if line.startswith("data: {"):
                    text += json.loads(line[6:])["choices"][0]["text"]
        return text


def test_every_request_gets_its_own_text_whichever_frontend_took_it(two):
    prompts = [f"Count to {i}:" for i in range(8)]

    async def run() -> tuple[list[str], list[str]]:
        alone = [await complete(two.url, p, 8, stream=False) for p in prompts]
        together = await asyncio.gather(
            *(complete(two.url, p, 8, stream=True) for p in prompts * 3)
        )
        return alone, together

    alone, together = asyncio.run(run())
    assert together == alone * 3  # greedy: each stream got its own prompt's tokens
    pids = frontend_pids(two)
    assert sorted(pids) == [0, 1]
    assert set(pids.values()) <= metrics_pids(two)  # both frontends served requests
    m = two.wait_idle()
    # /metrics from either frontend: the requests of both, summed
    for _ in range(6):
        with httpx.Client(base_url=two.url, timeout=10) as fresh:
            text = fresh.get("/metrics").text
        line = re.search(
            r'^zeroserve:request_success_total\{finished_reason="length"\} (\S+)$', text, re.M
        )
        assert (
            line is not None
            and float(line.group(1))
            == m['zeroserve:request_success_total{finished_reason="length"}']
        )
    assert m['zeroserve:request_success_total{finished_reason="length"}'] >= 32
    assert m["zeroserve:num_requests_in_flight"] == 0
    # /stats from either frontend: its own output tokens and the other's (PeerStats)
    time.sleep(0.5)  # each publishes its figures every 0.2 s
    for _ in range(6):
        with httpx.Client(base_url=two.url, timeout=10) as fresh:
            totals = fresh.get("/stats").json()["totals"]
        assert totals["output_tokens_total"] == m['zeroserve:generation_tokens_total{engine="0"}']
        assert totals["num_requests_in_flight"] == 0


def test_tokenizer_calls_and_a_responses_chain_across_frontends(two):
    tokens = set()
    for _ in range(8):
        with httpx.Client(base_url=two.url, timeout=10) as fresh:
            r = fresh.post("/tokenize", json={"prompt": "Hello there"})
            assert r.status_code == 200, r.text
            tokens.add(tuple(r.json()["tokens"]))
    assert len(tokens) == 1
    previous = None
    for turn in range(6):  # a fresh client each call: each may reach either frontend
        client = openai.OpenAI(base_url=two.url + "/v1", api_key="x", max_retries=0)
        r = client.responses.create(
            model="smollm2",
            input=f"Say {turn}.",
            max_output_tokens=4,
            temperature=0.0,
            previous_response_id=previous,
        )
        assert r.status == "incomplete" or r.status == "completed"
        items = client.responses.input_items.list(r.id)
        # the whole conversation: each earlier turn's input and output, and this input
        assert len(items.data) == 2 * turn + 1
        previous = r.id
        client.close()


async def watch_stream(url: str, prompt: str, seen: list[float]) -> None:
    """A long stream on a connection of its own; the arrival time of each event."""
    body = {"prompt": prompt, "max_tokens": 2000, "temperature": 0.0, "stream": True}
    body["ignore_eos"] = True
    async with (
        httpx.AsyncClient(base_url=url, timeout=60) as client,
        client.stream("POST", "/v1/completions", json=body) as r,
    ):
        r.raise_for_status()
        async for line in r.aiter_lines():
            if line.startswith("data: {"):
                seen.append(time.monotonic())


def test_a_killed_frontend_costs_only_its_own_streams(two):
    victim = frontend_pids(two)[1]
    pattern = r"frontend\.1 restarted \(pid \d+ -> \d+\): aborted its \d+"

    async def streams() -> tuple[list[BaseException | None], list[list[float]], float]:
        seen: list[list[float]] = [[] for _ in range(16)]
        tasks = [
            asyncio.ensure_future(watch_stream(two.url, f"Story {i}:", seen[i])) for i in range(16)
        ]
        await asyncio.sleep(1.0)  # every stream under way
        os.kill(victim, signal.SIGKILL)
        killed_at = time.monotonic()
        # the replica aborts the dead frontend's requests once its successor first beats
        deadline = killed_at + 60
        while not re.search(pattern, two.log()) and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        await asyncio.sleep(1.0)  # the other frontend's streams go on meanwhile
        ended = [t.exception() if t.done() else None for t in tasks]
        for t in tasks:
            t.cancel()  # a disconnect: the server aborts the rest
        await asyncio.gather(*tasks, return_exceptions=True)
        return ended, seen, killed_at

    ended, seen, killed_at = asyncio.run(streams())
    assert re.search(pattern, two.log()), two.log()[-3000:]
    cut = [i for i, e in enumerate(ended) if isinstance(e, httpx.TransportError)]
    going = [i for i, e in enumerate(ended) if e is None]
    assert cut and going and len(cut) + len(going) == 16, ended  # frontend 1's, frontend 0's
    for i in going:  # frontend 0's streams kept streaming after the kill and the restart
        assert seen[i] and seen[i][-1] > killed_at + 1.0, (i, seen[i][-3:], killed_at)

    # with frontend 1 back, every new request is served
    async def after() -> list[str]:
        return await asyncio.gather(
            *(complete(two.url, "Hello", 4, stream=False) for _ in range(6))
        )

    texts = asyncio.run(after())
    assert len(set(texts)) == 1
    assert frontend_pids(two).get(1) not in (None, victim), two.log()[-3000:]
    two.wait_idle(timeout_s=30)
    assert two.proc.poll() is None
