"""Streams and usage: the SSE wire format, stream_options (include_usage,
continuous_usage_stats), stage timings and cached tokens (fake backend, see fake_backend.py)."""

from __future__ import annotations

import time

import openai
import pytest

from tests.frontend.sse import parse_sse

pytestmark = pytest.mark.timeout(30)


def test_completion_streaming_sse(served, http):
    body = {"prompt": "Hi", "stream": True, "stream_options": {"include_usage": True}}
    with http.stream("POST", "/v1/completions", json=body) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        events = parse_sse(r.read().decode())
    assert events[-1] == "[DONE]"
    usage_chunk = events[-2]
    assert usage_chunk["choices"] == [] and usage_chunk["usage"] == {
        "prompt_tokens": 5,
        "completion_tokens": 3,
        "total_tokens": 8,
        "prompt_tokens_details": {"cached_tokens": 0},
    }
    chunks = events[:-2]
    assert all(c["object"] == "text_completion" and c["id"] == chunks[0]["id"] for c in chunks)
    assert all("usage" in c and c["usage"] is None for c in chunks)  # as OpenAI: null till the end
    assert "".join(c["choices"][0]["text"] for c in chunks) == "Hello world!"
    assert [c["choices"][0]["finish_reason"] for c in chunks][-1] == "stop"
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1])


def test_continuous_usage_stats_put_usage_in_every_chunk(served, http):
    """vLLM's stream_options.continuous_usage_stats: each chunk carries its choice's usage
    so far (chat's role chunk: 0 completion tokens); the last chunk is the total."""
    opts = {"include_usage": True, "continuous_usage_stats": True}
    body = {"messages": [{"role": "user", "content": "Hi"}], "stream": True, "stream_options": opts}
    with http.stream("POST", "/v1/chat/completions", json=body) as r:
        events = parse_sse(r.read().decode())
    assert events[-1] == "[DONE]"
    usages = [e["usage"] for e in events[:-1]]
    assert [u["completion_tokens"] for u in usages] == [0, 1, 2, 3, 3]
    assert all(u["prompt_tokens"] == 5 for u in usages)
    assert all(u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"] for u in usages)
    body = {"prompt": "Hi", "stream": True, "stream_options": opts}
    with http.stream("POST", "/v1/completions", json=body) as r:
        events = parse_sse(r.read().decode())
    assert [e["usage"]["completion_tokens"] for e in events[:-1]] == [1, 2, 3, 3]
    # without include_usage it asks for nothing (as vLLM)
    body["stream_options"] = {"continuous_usage_stats": True}
    with http.stream("POST", "/v1/completions", json=body) as r:
        events = parse_sse(r.read().decode())
    assert all("usage" not in e for e in events[:-1])


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions", "/generate"])
def test_stream_options_need_stream(served, http, path):
    body = {"stream_options": {"include_usage": True}, "stream": False}
    body |= (
        {"messages": [{"role": "user", "content": "Hi"}]} if "chat" in path else {"prompt": "Hi"}
    )
    r = http.post(path, json=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "stream_options"
    assert http.post(path, json={**body, "stream": True}).status_code == 200


def test_streaming_without_usage_has_no_usage_chunk(served, http):
    with http.stream("POST", "/v1/completions", json={"prompt": "Hi", "stream": True}) as r:
        events = parse_sse(r.read().decode())
    assert events[-1] == "[DONE]" and all("usage" not in e for e in events[:-1])


def test_stage_timings_reach_only_the_client_that_asked(served, http):
    """The workers stamp every finished request (for /metrics); return_timings stays in the
    frontend and decides whether the client sees them."""
    t0 = time.time()
    asked = http.post("/v1/completions", json={"prompt": "Hi", "return_timings": True}).json()
    took_ms = (time.time() - t0) * 1e3
    timings = asked["usage"]["timings"]
    assert timings.keys() == {"queue_ms", "scheduler_queue_ms"}, timings
    assert timings["scheduler_queue_ms"] == 2.0  # the fake's stamps, 2 ms apart
    # from the arrival, which never left the frontend, to the fake's (wall-clock) stamp
    assert 0 <= timings["queue_ms"] <= took_ms
    plain = http.post("/v1/completions", json={"prompt": "Hi"}).json()
    assert "timings" not in plain["usage"]


def test_cached_tokens_in_usage(served, http):
    """usage.prompt_tokens_details.cached_tokens: the prefix-cache hits the scheduler counted
    (the fake backend: a token prompt seen before hits its whole blocks but the last
    token), in completions and chat, whole and in the streamed usage chunk."""
    prompt = list(range(1000, 1011))  # 11 tokens: 2 whole blocks of 4 before the last
    first = http.post("/v1/completions", json={"prompt": prompt}).json()
    again = http.post("/v1/completions", json={"prompt": prompt}).json()
    assert first["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
    assert again["usage"]["prompt_tokens"] == 11
    assert again["usage"]["prompt_tokens_details"] == {"cached_tokens": 8}
    body = {"prompt": prompt, "stream": True, "stream_options": {"include_usage": True}}
    with http.stream("POST", "/v1/completions", json=body) as r:
        events = parse_sse(r.read().decode())
    assert events[-2]["usage"]["prompt_tokens_details"] == {"cached_tokens": 8}
    client = openai.OpenAI(base_url=served.url + "/v1", api_key="x", max_retries=0, timeout=10)
    c = client.completions.create(model=served.config.model_name, prompt=prompt)
    assert c.usage.prompt_tokens_details.cached_tokens == 8
    chat = client.chat.completions.create(
        model=served.config.model_name, messages=[{"role": "user", "content": "Hi"}]
    )
    assert chat.usage.prompt_tokens_details.cached_tokens == 0
