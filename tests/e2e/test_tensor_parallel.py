"""Tensor parallelism end to end on the CPU (gloo): `launch.py --tp 2` serves the default
model (its 9 query heads over 3 KV heads split 6 + 3: whole KV groups) through the openai
SDK with the single-process float server's greedy text; `--dp 2 --tp 2` serves 32
concurrent streams over two replicas of two ranks; SIGKILL of a replica's rank 1 under
load fails that replica's streams, launch.py restarts it, the other replica serves on; a
hung rank (SIGSTOP) fails its replica after --collective-timeout; SIGTERM stops every rank
(no process of the run dir left)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx
import openai
import pytest

from tests.e2e.conftest import REPO, Server, free_port, start_server
from tests.e2e.test_data_parallel import replica_pid, tokens_by_replica, wait_replica
from tests.e2e.test_faults import open_streams
from tests.frontend.sse import parse_sse

pytestmark = pytest.mark.timeout(600)
START_S = 400.0  # four ranks dequantize the GGUF's matrices at once on a loaded 2-core box
ERROR_WITHIN_S = 30.0  # a replica whose rank died: its streams end with an error within this


def run_dir_pids(server: Server) -> list[int]:
    """Every process whose command line names the server's run dir: the launcher's children
    and the ranks they started (their config copy lives there)."""
    out = subprocess.run(["pgrep", "-f", str(server.run_dir)], capture_output=True, text=True)
    return [int(p) for p in out.stdout.split()]


def serve(*extra: str) -> Iterator[Server]:
    server = start_server(*extra, workers=1, timeout_s=START_S)
    yield server
    code = server.stop(timeout_s=60)
    assert code == 0, server.log()[-4000:]
    assert run_dir_pids(server) == [], "a rank outlived SIGTERM"


def follower_pid(server: Server, replica: int) -> int:
    out = subprocess.run(
        ["pgrep", "-P", str(replica_pid(server, replica)), "-f", "scheduler_worker"],
        capture_output=True,
        text=True,
    )
    pids = [int(p) for p in out.stdout.split()]
    assert len(pids) == 1, pids
    return pids[0]


@pytest.fixture(scope="module")
def tp2(default_model_dir):
    # the float server's KV type, so that its greedy text is this one's
    yield from serve("--tp", "2", "--kv-cache-dtype", "float32", "--collective-timeout", "5")


@pytest.fixture(scope="module")
def dp2tp2(default_model_dir):
    yield from serve("--dp", "2", "--tp", "2")


PROMPT = [{"role": "user", "content": "Name three colours of the rainbow."}]


def test_tp2_serves_the_float_servers_greedy_text_through_the_openai_sdk(tp2, float_server):
    texts = []
    for server in (tp2, float_server):
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=120)
        chat = client.chat.completions.create(
            model="smollm2",
            messages=PROMPT,
            max_tokens=24,
            temperature=0,  # type: ignore[arg-type]
        )
        texts.append(chat.choices[0].message.content)
        stream = client.completions.create(
            model="smollm2", prompt="The capital of France is", max_tokens=12, temperature=0,
            stream=True,
        )  # fmt: skip
        texts.append("".join(c.choices[0].text for c in stream if c.choices))
    assert texts[0] and texts[:2] == texts[2:], texts
    assert "tensor-parallel rank 1 of 2 joined" in tp2.log()


def test_a_hung_rank_fails_its_replica_after_the_collective_timeout(tp2):
    """SIGSTOP of rank 1: rank 0's next collective waits --collective-timeout (5 s), then
    the replica stops (the stopped rank dies with it), its stream ends with an error, and
    launch.py starts it again."""
    threads, results = open_streams(tp2, 1, {"prompt": "Hang on.", "max_tokens": 2000})
    rank0, rank1 = replica_pid(tp2, 0), follower_pid(tp2, 0)
    hung = time.monotonic()
    subprocess.run(["kill", "-STOP", str(rank1)], check=True)
    for t in threads:
        t.join(timeout=ERROR_WITHIN_S + 10)
    took = time.monotonic() - hung
    assert not any(t.is_alive() for t in threads)
    status, text = results[0]
    assert status == 200 and '"error"' in text, text[-500:]
    assert 4.0 < took < ERROR_WITHIN_S + 10, took
    wait_replica(tp2.url, 0, alive=True, timeout_s=START_S)
    assert replica_pid(tp2, 0) != rank0
    assert rank1 not in run_dir_pids(tp2)  # the hung rank went with its replica


def test_dp2_tp2_serves_32_concurrent_streams(dp2tp2):
    before = tokens_by_replica(dp2tp2.url)

    async def main():
        limits = httpx.Limits(max_connections=32)
        async with httpx.AsyncClient(timeout=300, limits=limits) as client:

            async def one(i: int):
                body = {"prompt": f"Story {i}:", "max_tokens": 8, "ignore_eos": True,
                        "stream": True, "stream_options": {"include_usage": True}}  # fmt: skip
                r = await client.post(dp2tp2.url + "/v1/completions", json=body)
                return r.status_code, parse_sse(r.text)

            return await asyncio.gather(*(one(i) for i in range(32)))

    for status, events in asyncio.run(main()):
        assert status == 200 and events[-1] == "[DONE]"
        assert not any("error" in e for e in events[:-1])
        assert events[-2]["usage"]["completion_tokens"] == 8
    after = tokens_by_replica(dp2tp2.url)
    spread = {k: after[k] - before.get(k, 0) for k in ("0", "1")}
    assert sum(spread.values()) == 32 * 8 and min(spread.values()) > 0, spread
    # launch.py (its --run-dir), the frontend, tokenizer and detok, two ranks a replica
    assert len(run_dir_pids(dp2tp2)) == 4 + 2 * 2


def test_sigkill_of_rank_1_restarts_its_replica_while_the_other_serves(dp2tp2):
    body = {"prompt": "Go on.", "max_tokens": 2000, "data_parallel_rank": 0}
    threads, results = open_streams(dp2tp2, 4, body)
    old = replica_pid(dp2tp2, 0)
    victim = follower_pid(dp2tp2, 0)
    subprocess.run(["kill", "-KILL", str(victim)], check=True)
    for t in threads:
        t.join(timeout=ERROR_WITHIN_S)
    assert not any(t.is_alive() for t in threads), "a stream hung"
    assert len(results) == 4 and all(
        status == 200 and '"error"' in text for status, text in results
    ), results
    # the other replica serves on while replica 0 restarts
    r = httpx.post(
        dp2tp2.url + "/v1/completions",
        json={"prompt": "Still here?", "max_tokens": 4, "data_parallel_rank": 1},
        timeout=120,
    )
    assert r.status_code == 200, r.text
    wait_replica(dp2tp2.url, 0, alive=True, timeout_s=START_S)
    assert replica_pid(dp2tp2, 0) != old and victim not in run_dir_pids(dp2tp2)
    r = httpx.post(
        dp2tp2.url + "/v1/completions",
        json={"prompt": "Back?", "max_tokens": 4, "data_parallel_rank": 0},
        timeout=120,
    )
    assert r.status_code == 200, r.text
    assert "restarting it" in dp2tp2.log()  # SIGTERM at teardown: serve() checks every rank


def joins_and_serves(server: Server, replica: int) -> None:
    """`replica` joins the running server and serves a request pinned to it."""
    wait_replica(server.url, replica, alive=True, timeout_s=START_S)
    r = httpx.post(
        server.url + "/v1/completions",
        json={"prompt": "Hello", "max_tokens": 4, "data_parallel_rank": replica},
        timeout=120,
    )
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 4


def test_a_torchrun_replica_joins_and_stops_on_sigterm(tp2):
    """torchrun starts a replica's two ranks itself (its RANK / WORLD_SIZE / MASTER_ADDR
    environment, the shape of a replica that spans hosts): they join the running server as
    replica 1, serve a pinned request, and SIGTERM to torchrun stops both."""
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2"]
    args = ["--config", str(tp2.run_dir / "config.json"), "--replica-id", "1", "--tp", "2"]
    log = tp2.run_dir.parent / f"{tp2.run_dir.name}-torchrun.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [*torchrun, "--master-port", str(free_port()), "-m", "scheduler_worker", *args],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=REPO,
        )  # fmt: skip
    try:
        joins_and_serves(tp2, 1)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=90)  # torchrun's own code on a signal is its business
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = log.read_text()
    assert "tensor-parallel rank 1 of 2 joined" in text and "stopped by rank 0" in text, text
    wait_replica(tp2.url, 1, alive=False, timeout_s=30)
    left = subprocess.run(["pgrep", "-f", "--replica-id 1 --tp 2"], capture_output=True)
    assert left.stdout == b"", "a torchrun rank outlived SIGTERM"


def test_leaderworkerset_pods_join_as_one_replica_and_stop_together(tp2):
    """A LeaderWorkerSet group's pods, one rank each (deploy/kubernetes-multihost): every
    pod runs the same command, its place from LWS_WORKER_INDEX / LWS_GROUP_SIZE /
    LWS_LEADER_ADDRESS and nothing else; they join the running server as replica 2, serve
    a pinned request, and SIGTERM to the leader stops both (the follower on its STOP)."""
    args = ["--config", str(tp2.run_dir / "config.json"), "--replica-id", "2", "--tp", "2"]
    port, procs, logs = free_port(), [], []
    for index in (0, 1):
        env = {**os.environ, "LWS_GROUP_SIZE": "2", "LWS_WORKER_INDEX": str(index)}
        env |= {"LWS_LEADER_ADDRESS": "127.0.0.1", "MASTER_PORT": str(port)}
        for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR"):
            env.pop(name, None)
        logs.append(tp2.run_dir.parent / f"{tp2.run_dir.name}-lws{index}.log")
        with open(logs[-1], "wb") as out:
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "scheduler_worker", *args],
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    cwd=REPO,
                    env=env,
                )  # fmt: skip
            )
    try:
        joins_and_serves(tp2, 2)
        procs[0].send_signal(signal.SIGTERM)
        assert procs[0].wait(timeout=90) == 0
        assert procs[1].wait(timeout=30) == 0  # STOP from the leader, not a failed collective
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    leader, follower = (log.read_text() for log in logs)
    assert "tensor-parallel rank 0 of 2 joined" in leader, leader
    assert "tensor-parallel rank 1 of 2 joined" in follower, follower
    assert "stopped by rank 0" in follower, follower
    wait_replica(tp2.url, 2, alive=False, timeout_s=30)
