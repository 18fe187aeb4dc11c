"""Errors while a request runs, as OpenAI JSON: a worker's error passed through, an error
after a stream started (an SSE event, or the plain-text stream ended), overload (503,
per frontend's share of the limit) and timeouts (504)."""

from __future__ import annotations

import threading

import httpx
import pytest

from tests.frontend.conftest import openai_error, serve
from tests.frontend.sse import parse_sse

pytestmark = pytest.mark.timeout(30)


@pytest.mark.parametrize("stream", [False, True])
def test_worker_request_error_passes_through(http, stream):
    # streaming too: the response waits for the first output, so the error keeps its status
    err = openai_error(http.post("/v1/completions", json={"prompt": "bad", "stream": stream}), 400)
    assert err == {
        "message": "prompt is bad",
        "type": "invalid_request_error",
        "param": "prompt",
        "code": None,
    }


def test_error_after_stream_started_is_an_sse_event(http):
    with http.stream("POST", "/v1/completions", json={"prompt": "fail-late", "stream": True}) as r:
        assert r.status_code == 200
        events = parse_sse(r.read().decode())
    assert events[0]["choices"][0]["text"] == "Hello"
    assert events[-2]["error"]["message"] == "engine exploded"
    assert events[-1] == "[DONE]"


def test_error_after_a_plain_text_stream_started_ends_it(served, http):
    """/generate streams plain text, which cannot carry an error: the text so far, then
    the end of the stream; the request is released (nothing left in flight)."""
    with http.stream("POST", "/generate", json={"prompt": "fail-late"}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
        assert r.read().decode() == "Hello"
    assert not served.app.state.client.routes


def test_error_after_start_non_streaming_keeps_its_status(http):
    err = openai_error(http.post("/v1/completions", json={"prompt": "fail-late"}), 500)
    assert err["type"] == "server_error"


def test_too_many_requests_in_flight_is_503():
    with serve(max_queued_requests=1) as s, s.client() as c:
        held: dict = {}
        t = threading.Thread(target=lambda: held.setdefault("r", _post_quietly(s.url, "hold")))
        t.start()
        assert s.backend.wait_for(lambda b: any(r.prompt == "hold" for r in b.requests))
        err = openai_error(c.post("/v1/completions", json={"prompt": "Hi"}), 503)
        assert err["code"] == "overloaded"
        # n=2 can never fit a limit of 1: a client error naming both, not "retry later"
        err = openai_error(c.post("/v1/completions", json={"prompt": "Hi", "n": 2}), 400)
        assert err["param"] == "n" and "max_queued_requests" in err["message"]
        assert s.backend.wait_for(lambda b: len(b.aborts) == 1, 5)  # the held client gave up
        t.join(5)
        assert c.post("/v1/completions", json={"prompt": "Hi"}).status_code == 200


def test_several_frontends_each_admit_their_share_of_the_limit():
    """api_servers 2: this frontend takes 2 of max_queued_requests 4 in flight; a request
    within the whole limit but above the share is still taken when nothing else runs."""
    with serve(max_queued_requests=4, api_servers=2) as s, s.client() as c:
        held = [threading.Thread(target=_post_quietly, args=(s.url, "hold")) for _ in range(2)]
        for t in held:
            t.start()
        assert s.backend.wait_for(lambda b: sum(r.prompt == "hold" for r in b.requests) == 2)
        err = openai_error(c.post("/v1/completions", json={"prompt": "Hi"}), 503)
        assert err["code"] == "overloaded"
        assert s.backend.wait_for(lambda b: len(b.aborts) == 2, 5)  # the held clients gave up
        for t in held:
            t.join(5)
        r = c.post("/v1/completions", json={"prompt": "Hi", "n": 3})
        assert r.status_code == 200 and len(r.json()["choices"]) == 3


def _post_quietly(url: str, prompt: str) -> int | None:
    try:  # the client gives up after 0.5 s: a disconnect the server must turn into an abort
        return httpx.post(url + "/v1/completions", json={"prompt": prompt}, timeout=0.5).status_code
    except httpx.TimeoutException:
        return None


def test_timeout_aborts_and_is_504():
    with serve(request_timeout_s=0.3) as s, s.client() as c:
        err = openai_error(c.post("/v1/completions", json={"prompt": "hold"}), 504)
        assert err["code"] == "timeout"
        assert err == openai_error(
            c.post("/v1/completions", json={"prompt": "hold", "stream": True}), 504
        )
        with c.stream("POST", "/v1/completions", json={"prompt": "slow", "stream": True}) as r:
            assert r.status_code == 200
            events = parse_sse(r.read().decode())
        assert events[-2]["error"]["code"] == "timeout" and events[-1] == "[DONE]"
        assert s.backend.wait_for(lambda b: len(b.aborts) == 3)
        assert set(s.backend.aborted().values()) == {"timeout"}
