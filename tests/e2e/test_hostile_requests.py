"""Hand-written hostile requests (hostile_cases.py), each with its exact status and the
parameter / limit the error must name; afterwards the server still serves, no worker
restarted and every KV block is free again (tests/e2e/api_checks.py). Valid but extreme
sampling values on a private server. Bodies at the limits and Content-Type:
test_hostile_bodies.py. Schema-driven fuzzing: test_fuzz.py."""

from __future__ import annotations

import time

import httpx
import pytest

from tests.e2e.api_checks import assert_intact, assert_openai_error
from tests.e2e.conftest import start_server
from tests.e2e.hostile_cases import HOSTILE

pytestmark = [pytest.mark.timeout(300), pytest.mark.usefixtures("pids_before")]


@pytest.mark.parametrize("path,content,status,param,words", HOSTILE)
def test_hostile_request(server, path, content, status, param, words):
    r = httpx.post(
        server.url + path, content=content, timeout=60, headers={"content-type": "application/json"}
    )
    assert r.status_code == status, r.text[:500]
    err = assert_openai_error(r.status_code, r.text, path)
    assert err["type"] == "invalid_request_error", err
    assert err["param"] == param, err
    assert all(w in err["message"] for w in words), err


def test_intact_after_hostile_requests(server, pids_before):
    """Every hostile request above, back to back, then: it still serves, no process
    restarted, every KV block free (whether or not the cases above ran before)."""
    for case in HOSTILE:
        path, content, status = case.values[:3]
        r = httpx.post(
            server.url + path,
            content=content,
            timeout=60,
            headers={"content-type": "application/json"},
        )
        assert r.status_code == status, (case.id, r.text[:300])
    assert_intact(server, pids_before)


# -- valid requests that kill the scheduler: on a private server -----------------------------
@pytest.fixture(scope="module")
def private_server(default_model_dir):
    s = start_server(workers=1)
    yield s
    s.stop()


@pytest.mark.parametrize(
    "params",
    [{"top_p": 1e-46}, {"repetition_penalty": 1e-38, "top_p": 0.9}],
    ids=["top_p-1e-46", "repetition_penalty-1e-38"],
)
def test_extreme_sampling_params_are_served(private_server, params):
    """In range (top_p in (0, 1], repetition_penalty > 0), so it must generate; refusing
    it with a 400 would do too, but a dead scheduler must not."""
    deadline = time.monotonic() + 60  # a previous case may have killed the scheduler
    while httpx.get(private_server.url + "/health", timeout=5).status_code != 200:
        assert time.monotonic() < deadline, "the private server did not come back"
        time.sleep(0.2)
    pids = sorted(private_server.pids())
    r = httpx.post(
        private_server.url + "/v1/completions",
        timeout=60,
        json={"prompt": "hi hi hi", "max_tokens": 2, **params},
    )
    assert r.status_code in (200, 400), r.text
    assert sorted(private_server.pids()) == pids, "a server process died"
