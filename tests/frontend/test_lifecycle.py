"""Readiness (/health), client disconnects turning into aborts, /metrics, and a dispatcher
that survives bad input."""

from __future__ import annotations

import os
import re
import socket
import time
from dataclasses import replace
from pathlib import Path

import httpx
import pytest

from common.messages import ComponentStatus, TextOutputs, pack_ids
from tests.frontend.conftest import serve, wait_healthy, wait_until
from tests.frontend.fake_backend import WEIGHT_BYTES

pytestmark = pytest.mark.timeout(30)


def test_health_503_until_components_report():
    with serve(ready=False) as s, s.client() as c:
        r = c.get("/health")
        assert r.status_code == 503
        assert r.json()["status"] == "unavailable"
        assert sorted(r.json()["missing"]) == ["detok", "scheduler", "tokenizer"]
        err = c.post("/v1/completions", json={"prompt": "Hi"})
        assert err.status_code == 503 and err.json()["error"]["code"] == "not_ready"
        assert "tokenizer" in err.json()["error"]["message"]
        s.backend.announce()
        wait_healthy(s.url, 3)
        body = c.get("/health").json()
        assert body["status"] == "ok"
        assert body["components"]["tokenizer"]["workers"] == 1
        assert all(v["alive"] for v in body["components"].values())


def test_listen_when_ready_opens_the_port_only_once_every_component_is_up():
    """launch.py's mode: no 503 phase, the port is closed until the components are up."""
    with serve(ready=False, listen_when_ready=True) as s:
        # its lifespan startup began (it bound its sockets) and waits there, hearing
        # nothing: the port stays closed
        run_dir = Path(s.config.ipc.run_dir)
        wait_until(lambda: (run_dir / "frontend.sock").exists(), "the frontend's sockets")
        for _ in range(5):
            with pytest.raises(httpx.ConnectError):
                httpx.get(s.url + "/health", timeout=2)
            time.sleep(0.1)
        s.backend.announce()
        deadline = time.monotonic() + 10
        while True:
            try:
                r = httpx.get(s.url + "/health", timeout=2)
                break
            except httpx.ConnectError:
                assert time.monotonic() < deadline, "the port never opened"
                time.sleep(0.05)
        assert r.status_code == 200 and r.json()["status"] == "ok"


def test_health_notices_a_stopping_component(served, http):
    served.backend.pause_heartbeats()
    try:
        served.backend.send(ComponentStatus("tokenizer", os.getpid(), "stopping", time.time()))
        deadline = time.monotonic() + 2
        while (r := http.get("/health")).status_code == 200 and time.monotonic() < deadline:
            time.sleep(0.005)
        assert r.status_code == 503 and r.json()["missing"] == ["tokenizer"]
        err = http.post("/v1/completions", json={"prompt": "Hi"})
        assert err.status_code == 503 and "tokenizer" in err.json()["error"]["message"]
    finally:
        served.backend.pause_heartbeats(False)
    wait_healthy(served.url, 3)


def test_requests_a_lost_tokenizer_held_fail_fast():
    """A request sent to a tokenizer that then dies or hangs (falls silent: "stranded")
    fails with 503 within a liveness window (3 s here) instead of waiting out the request
    timeout; the other tokenizer serves the rest."""
    with serve() as s, s.client(timeout=30) as c:
        s.backend.add_tokenizer()
        wait_until(lambda: c.get("/health").json()["components"]["tokenizer"]["workers"] == 2, "2")
        t0 = time.monotonic()
        r = c.post("/v1/completions", json={"prompt": "stranded"})
        assert r.status_code == 503, r.text
        assert r.json()["error"]["code"] == "component_failed"
        assert time.monotonic() - t0 < 10  # ~3 s; the request timeout is 600 s
        assert c.post("/v1/completions", json={"prompt": "Hi"}).status_code == 200


def _raw_post(port: int, path: str, body: bytes) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    sock.sendall(
        b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (path.encode(), len(body), body)
    )
    return sock


@pytest.mark.parametrize(
    "path, body, wait_first",
    [
        ("/v1/completions", b'{"prompt": "slow", "stream": true}', True),  # mid-stream
        (
            "/v1/chat/completions",
            b'{"messages": [{"role": "user", "content": "slow"}], "stream": true}',
            True,
        ),
        ("/generate", b'{"prompt": "slow"}', True),
        ("/v1/completions", b'{"prompt": "hold"}', False),  # non-streaming, nothing sent yet
        ("/v1/completions", b'{"prompt": "hold", "stream": true}', False),  # before the first token
    ],
)
def test_client_disconnect_aborts_promptly(served, path, body, wait_first):
    port = int(served.url.rsplit(":", 1)[1])
    before = len(served.backend.aborted())
    sock = _raw_post(port, path, body)
    try:
        if wait_first:
            assert b"200 OK" in sock.recv(65536)  # headers and the first chunk(s)
        else:
            assert served.backend.wait_for(
                lambda b: len(b.requests) and b.requests[-1].rid not in {a.rid for a in b.aborts}
            )
            routes = served.app.state.client.routes  # the frontend waits on it, watching:
            rid = served.backend.requests[-1].rid
            wait_until(
                lambda: rid in routes and routes[rid][0].watcher is not None,
                "the disconnect watcher",
            )
    finally:
        sock.close()
    # within a step of the disconnect; without the watcher, "hold" would wait 600 s
    assert served.backend.wait_for(lambda b: len(b.aborts) > before, timeout_s=3.0)
    rid = served.backend.requests[-1].rid
    assert served.backend.aborted()[rid] == "client_disconnect"


def test_dispatcher_survives_bad_messages(served, http):
    # unequal parallel lists, and outputs for rids nobody waits for: dropped, nothing breaks
    served.backend.send(
        TextOutputs(
            ["a", "b"], ["x"], [None], [1], [1], [pack_ids([1])], None, None, [None], time.time()
        )
    )
    served.backend.send(
        TextOutputs(
            ["zzz"], ["x"], ["stop"], [1], [1], [pack_ids([1])], None, None, [None], time.time()
        )
    )
    # the backend pushes them before any output of the next request, on the one socket
    # the inbox reads in order: they are dispatched first
    r = http.post("/v1/completions", json={"prompt": "Hi"})
    assert r.status_code == 200 and r.json()["choices"][0]["text"] == "Hello world!"


def _metric(text: str, name: str) -> float:
    m = re.search(rf"^{re.escape(name)} ([0-9.e+-]+)$", text, re.M)
    assert m, f"{name} not in /metrics"
    return float(m.group(1))


def _metrics(text: str) -> dict[str, float]:
    return {
        name: float(value)
        for name, value in re.findall(r"^(zeroserve:\S+) ([0-9.e+-]+)$", text, re.M)
    }


def test_metrics(served, http):
    before = _metrics(http.get("/metrics").text)  # the module's other tests counted too
    for _ in range(2):
        assert (
            http.post("/v1/completions", json={"prompt": "Hi", "return_timings": True}).status_code
            == 200
        )
    with http.stream("POST", "/v1/completions", json={"prompt": "Hi", "stream": True}) as r:
        r.read()
    r = http.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    text = r.text
    for name in (
        "num_requests_running",
        "num_requests_waiting",
        "kv_cache_usage_perc",
        "prefix_cache_queries_total",
        "prefix_cache_hits_total",
        'prompt_tokens_total{engine="0"}',
        'generation_tokens_total{engine="0"}',
        "num_requests_in_flight",
    ):
        _metric(text, "zeroserve:" + name)
    assert _metric(text, "zeroserve:kv_cache_usage_perc") == 0.25
    assert _metric(text, "zeroserve:prefix_cache_queries_total") == 100
    assert _metric(text, "zeroserve:prefix_cache_hits_total") == 40
    assert _metric(text, 'zeroserve:model_weight_bytes{engine="0"}') == WEIGHT_BYTES
    after = _metrics(text)

    def added(name: str) -> float:
        return after.get("zeroserve:" + name, 0) - before.get("zeroserve:" + name, 0)

    # three requests of three one-token steps ("Hello", " world", "!"), 5 prompt tokens each
    assert added('generation_tokens_total{engine="0"}') == 9
    assert added('prompt_tokens_total{engine="0"}') == 15
    assert added('request_success_total{finished_reason="stop"}') == 3
    assert added("time_to_first_token_seconds_count") == 3
    assert added("inter_token_latency_seconds_count") == 6  # tokens after the first
    assert added("e2e_request_latency_seconds_count") == 3
    # every finished request carries its stage stamps (the metrics need them); only the
    # two that asked (return_timings) show them to the client
    assert added("request_queue_time_seconds_count") == 3


def test_aborted_requests_count_their_tokens():
    """A stream the client cuts still adds the tokens it got to the token counters (they
    were computed); it counts as an abort, not a success."""
    with serve() as s, s.client() as c:
        with c.stream("POST", "/v1/completions", json={"prompt": "slow", "stream": True}) as r:
            lines = r.iter_lines()
            got = sum(1 for line, _ in zip(lines, range(40)) if line.startswith("data: "))
        assert got >= 5
        assert s.backend.wait_for(lambda b: len(b.aborts) == 1)
        text = c.get("/metrics").text
        assert _metric(text, 'zeroserve:generation_tokens_total{engine="0"}') >= got
        assert _metric(text, 'zeroserve:prompt_tokens_total{engine="0"}') == 5  # NUM_PROMPT_TOKENS
        assert _metric(text, 'zeroserve:request_success_total{finished_reason="abort"}') == 1


def test_token_counters_per_replica_and_prefix_counters_move_with_the_outputs():
    """The prompt and generation token counters carry the replica that stepped, as its
    outputs say (not the frontend's routing: replica 1 below was never routed to), and
    the prefix-cache counters follow the cumulative values on the step outputs at once,
    with no heartbeat in between (they are paused)."""
    with serve() as s, s.client() as c:
        assert c.post("/v1/completions", json={"prompt": "Hi"}).status_code == 200
        text = c.get("/metrics").text
        assert _metric(text, "zeroserve:prefix_cache_queries_total") == 100
        s.backend.pause_heartbeats()
        # an output of a request the frontend does not know still says what replica 1 did
        outputs = TextOutputs(
            ["zzz"], ["x"], [None], [1], [1], [pack_ids([1])], None, None, [None], time.time()
        )
        s.backend.send(replace(outputs, replica=1, prefix_cache=[130, 55]))
        s.backend.send(replace(outputs, replica=0, prefix_cache=[160, 60]))

        def moved() -> bool:
            return _metric(c.get("/metrics").text, "zeroserve:prefix_cache_hits_total") == 115

        wait_until(moved, "the prefix-cache counters to move")  # 40 + 55 + (60 - 40)
        text = c.get("/metrics").text
        assert _metric(text, "zeroserve:prefix_cache_queries_total") == 100 + 130 + 60
        assert _metric(text, 'zeroserve:prompt_tokens_total{engine="0"}') == 5
        assert 'prompt_tokens_total{engine="1"}' not in text  # unknown rids count nowhere
        s.backend.pause_heartbeats(False)
        s.backend.output_replica = 1  # what it stepped, replica 1 says, whatever the routing
        assert c.post("/v1/completions", json={"prompt": "Hi"}).status_code == 200
        text = c.get("/metrics").text
        assert _metric(text, 'zeroserve:prompt_tokens_total{engine="1"}') == 5
        assert _metric(text, 'zeroserve:generation_tokens_total{engine="1"}') == 3
        assert _metric(text, 'zeroserve:prompt_tokens_total{engine="0"}') == 5
