"""Data parallelism end to end: `launch.py --dp 2` (two scheduler replicas behind one
frontend, tokenizer pool and detok), replicas joining by hand, refused, killed and
restarted, pinned requests (the multi-host shape over tcp: test_data_parallel_tcp.py)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.e2e.conftest import REPO, served
from tests.e2e.test_faults import open_streams
from tests.frontend.sse import parse_sse

pytestmark = pytest.mark.timeout(300)
ERROR_WITHIN_S = 10.0  # a killed replica's streams end with an error event within this


@pytest.fixture(scope="module")
def dp(default_model_dir):
    yield from served("--dp", "2", workers=1)


def replica_pid(server, replica: int) -> int:
    pattern = f"-m scheduler_worker --config {server.run_dir}/config.json --replica-id {replica}"
    out = subprocess.run(["pgrep", "-f", "--", pattern], capture_output=True, text=True)
    pids = [int(p) for p in out.stdout.split()]
    assert len(pids) == 1, (replica, pids)
    return pids[0]


def replicas(url: str) -> dict[str, dict]:
    return httpx.get(url + "/health", timeout=5).json()["components"]["scheduler"]["replicas"]


def wait_replica(url: str, replica: int, alive: bool = True, timeout_s: float = 90) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            got = replicas(url).get(str(replica), {}).get("alive", False)
        except (httpx.HTTPError, ValueError, KeyError):
            got = None
        if got == alive:
            return
        assert time.monotonic() < deadline, f"replica {replica} not alive={alive}"
        time.sleep(0.2)


def complete(url: str, prompt: str, rank: int | None = None, **kw) -> httpx.Response:
    body = {"prompt": prompt, "max_tokens": 8, "temperature": 0, "ignore_eos": True, **kw}
    if rank is not None:
        body["data_parallel_rank"] = rank
    return httpx.post(url + "/v1/completions", json=body, timeout=120)


def tokens_by_replica(url: str) -> dict[str, int]:
    """Tokens each replica generated, from /metrics' per-replica counters: labelled with
    the replica that stepped, as its outputs say (TextOutputs.replica), not with where
    the frontend routed the request."""
    text = httpx.get(url + "/metrics", timeout=5).text
    found = re.findall(r'^zeroserve:generation_tokens_total\{engine="(\d+)"\} (\S+)$', text, re.M)
    return {k: int(float(v)) for k, v in found}


def test_64_streams_spread_over_both_replicas_with_exact_counts(dp):
    before = tokens_by_replica(dp.url)

    async def main():
        async with httpx.AsyncClient(
            timeout=120, limits=httpx.Limits(max_connections=64)
        ) as client:

            async def one(i: int) -> tuple[int, list]:
                body = {
                    "prompt": f"Request {i}:",
                    "max_tokens": 8,
                    "ignore_eos": True,
                    "stream": True,
                    "stream_options": {"include_usage": True},
                }
                r = await client.post(dp.url + "/v1/completions", json=body)
                return r.status_code, parse_sse(r.text)

            return await asyncio.gather(*(one(i) for i in range(64)))

    for status, events in asyncio.run(main()):
        assert status == 200 and events[-1] == "[DONE]"
        assert events[-2]["usage"]["completion_tokens"] == 8
        assert not any("error" in e for e in events[:-1])
    after = tokens_by_replica(dp.url)
    spread = {k: after[k] - before.get(k, 0) for k in ("0", "1")}
    assert sum(spread.values()) == 64 * 8
    assert min(spread.values()) >= 64 * 8 // 4, spread  # both got a fair share of the work
    metrics = dp.metrics()
    assert 'zeroserve:replica_num_requests_running{engine="1"}' in metrics
    assert 'zeroserve:replica_kv_cache_usage_perc{engine="0"}' in metrics
    for k in (0, 1):  # where each runs, named (on a GPU: its name and GPU id)
        assert metrics[f'zeroserve:replica_device_info{{device="cpu",engine="{k}",gpus=""}}'] == 1
    assert {k: (r["device"], r["gpus"]) for k, r in replicas(dp.url).items()} == {
        "0": ("cpu", []),
        "1": ("cpu", []),
    }
    dp.wait_idle(timeout_s=15)


def test_pinned_requests_and_greedy_output_agree_across_replicas(dp, server):
    prompt = "The capital of France is"
    one = complete(server.url, prompt)  # the --dp 1 server of the session
    assert one.status_code == 200, one.text
    texts = [one.json()["choices"][0]["text"]]
    for rank in (0, 1):
        before = tokens_by_replica(dp.url).get(str(rank), 0)
        r = complete(dp.url, prompt, rank)
        assert r.status_code == 200, r.text
        texts.append(r.json()["choices"][0]["text"])
        assert tokens_by_replica(dp.url)[str(rank)] == before + 8
    assert texts[0] == texts[1] == texts[2]  # whole engines, one model: greedy agrees
    r = httpx.post(
        dp.url + "/v1/completions",
        json={"prompt": prompt, "max_tokens": 8, "temperature": 0},
        headers={"X-Data-Parallel-Rank": "1"},
        timeout=60,
    )
    assert r.status_code == 200 and r.json()["choices"][0]["text"] == texts[2]
    for bad in (complete(dp.url, prompt, 7), complete(dp.url, prompt, -1)):
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "data_parallel_rank"
    r = httpx.post(
        dp.url + "/v1/completions",
        json={"prompt": prompt},
        headers={"X-Data-Parallel-Rank": "one"},
        timeout=60,
    )
    assert r.status_code == 400


def test_sigkill_of_one_replica_fails_only_its_streams_and_it_rejoins(dp):
    victim = replica_pid(dp, 1)
    body = {"prompt": "Tell a long story.", "max_tokens": 300}
    threads0, results0 = open_streams(dp, 3, {**body, "data_parallel_rank": 0})
    threads1, results1 = open_streams(dp, 3, {**body, "data_parallel_rank": 1})
    dp.proc.send_signal(signal.SIGSTOP)  # no restart yet: /health must show the hole
    try:
        killed_at = time.monotonic()
        os.kill(victim, signal.SIGKILL)
        for t in threads1:
            t.join(timeout=ERROR_WITHIN_S + 5)
        took = time.monotonic() - killed_at
        health = httpx.get(dp.url + "/health", timeout=5)
        assert health.status_code == 200, health.text  # replica 0 serves
        assert health.json()["components"]["scheduler"]["replicas"]["1"]["alive"] is False
        r = complete(dp.url, "pinned to the dead one", 1)
        assert r.status_code == 503 and r.json()["error"]["code"] == "replica_unavailable"
        assert complete(dp.url, "routed around it").status_code == 200
    finally:
        dp.proc.send_signal(signal.SIGCONT)
    assert took <= ERROR_WITHIN_S, f"the dead replica's streams took {took:.1f} s to end"
    assert len(results1) == 3
    for status, text in results1:
        *events, done = parse_sse(text)
        assert status == 200 and done == "[DONE]"
        assert "error" in events[-1], text[-300:]
    for t in threads0:
        t.join(timeout=120)
    assert len(results0) == 3
    for status, text in results0:
        *events, done = parse_sse(text)
        assert status == 200 and done == "[DONE]" and not any("error" in e for e in events)
        assert events[-1]["choices"][0]["finish_reason"] == "length"
    wait_replica(dp.url, 1)  # launch.py restarted it
    assert replica_pid(dp, 1) != victim
    r = complete(dp.url, "after the restart", 1)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 8
    dp.wait_idle(timeout_s=15)


def start_replica(config: Path, replica: int, *extra: str, prefix: tuple[str, ...] = ()):
    return subprocess.Popen(
        [
            *prefix,
            sys.executable,
            "-m",
            "scheduler_worker",
            "--config",
            str(config),
            "--replica-id",
            str(replica),
            "--threads",
            "1",
            *extra,
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
    )


def test_replicas_started_by_hand_join_or_are_refused(dp):
    config = dp.run_dir / "config.json"
    # a second process claiming a live replica's id: refused before it loads the model
    dup = start_replica(config, 0)
    out, _ = dup.communicate(timeout=60)
    assert dup.returncode == 2 and "another process serves its inbox" in out, out
    # another secret: it loads, announces itself, and is refused; it serves nothing
    data = json.loads(config.read_text())
    data["ipc"]["secret"] = "not-the-secret"
    wrong = dp.run_dir / "wrong.json"
    fd = os.open(wrong, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(data, f)
    stranger = start_replica(wrong, 3)
    joiner = start_replica(config, 2)
    try:
        wait_replica(dp.url, 2)
        r = complete(dp.url, "to the newcomer", 2)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 8
        deadline = time.monotonic() + 60
        while "refused scheduler replica 3" not in dp.log():
            assert time.monotonic() < deadline and stranger.poll() is None, dp.log()[-2000:]
            time.sleep(0.2)
        assert dp.log().count("refused scheduler replica 3") == 1
        assert "3" not in replicas(dp.url)
        assert complete(dp.url, "to the stranger", 3).status_code == 400
        joiner.send_signal(signal.SIGTERM)  # it finishes what it holds, then leaves
        assert joiner.wait(timeout=60) == 0
        wait_replica(dp.url, 2, alive=False, timeout_s=10)
        assert httpx.get(dp.url + "/health", timeout=5).status_code == 200
    finally:
        for p in (stranger, joiner):
            if p.poll() is None:
                p.kill()
                p.wait()


def test_components_with_other_model_facts_are_refused(dp):
    """The replicas own the model facts: a replica with another KV block size, and a
    tokenizer worker with another context length, are each refused with one log line and
    serve nothing (a prompt longer than that worker's context would fail there: none do)."""
    config = dp.run_dir / "config.json"
    other_block = start_replica(config, 4, "--block-size", "32")
    short_tokenizer = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tokenizer_worker",
            "--config",
            str(config),
            "--max-model-len",
            "64",
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    try:
        deadline = time.monotonic() + 90
        while not (
            "refused scheduler replica 4" in dp.log() and "refused tokenizer worker" in dp.log()
        ):
            assert time.monotonic() < deadline, dp.log()[-2000:]
            assert other_block.poll() is None and short_tokenizer.poll() is None
            time.sleep(0.2)
        log = dp.log()
        line = next(x for x in log.splitlines() if "refused scheduler replica 4" in x)
        assert "block_size 32 (not 16)" in line, line
        line = next(x for x in log.splitlines() if "refused tokenizer worker" in x)
        assert f"(pid {short_tokenizer.pid})" in line and "max_model_len 64" in line, line
        long_prompt = "one two three four " * 30  # about 120 tokens: past 64
        for _ in range(6):  # the pool would alternate between its two workers
            r = complete(dp.url, long_prompt)
            assert r.status_code == 200, r.text
        time.sleep(1.0)  # their heartbeats go on: not logged again
        log = dp.log()
        assert log.count("refused scheduler replica 4") == 1
        assert log.count("refused tokenizer worker") == 1
        assert "4" not in replicas(dp.url)
        health = httpx.get(dp.url + "/health", timeout=5).json()["components"]["tokenizer"]
        assert health["refused"] == 1 and health["workers"] >= 1, health
    finally:
        for p in (other_block, short_tokenizer):
            if p.poll() is None:
                p.kill()
                p.wait()
