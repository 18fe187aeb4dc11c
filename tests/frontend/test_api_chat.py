"""The happy paths of chat completions, streamed and not, n > 1 and logprobs, and the
official openai client against the real app (fake backend, see fake_backend.py)."""

from __future__ import annotations

import openai
import pytest

from tests.frontend.conftest import requests_for
from tests.frontend.sse import parse_sse

pytestmark = pytest.mark.timeout(30)


def test_chat_non_streaming(served, http):
    r = http.post(
        "/v1/chat/completions",
        json={
            "model": served.config.model_name,
            "messages": [
                {"role": "system", "content": "Be brief."},
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "Hi"}, {"type": "text", "text": " there"}],
                },
            ],
        },
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")
    (choice,) = body["choices"]
    assert choice["message"] == {"role": "assistant", "content": "Hello world!"}
    assert choice["finish_reason"] == "stop"
    assert body["usage"]["total_tokens"] == 8
    (req,) = requests_for(served, body["id"])
    assert req.kind == "chat" and req.prompt is None
    assert req.messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi there"},
    ]
    # unset, no cap: the room the prompt leaves, settled by the tokenizer
    assert req.params.max_tokens is None and req.params.max_tokens_cap is None


def test_chat_max_completion_tokens_wins(served, http):
    r = http.post(
        "/v1/chat/completions",
        json={
            "messages": [{"role": "user", "content": "Hi"}],
            "max_tokens": 50,
            "max_completion_tokens": 2,
        },
    )
    assert r.status_code == 200
    assert r.json()["choices"][0]["finish_reason"] == "length"
    (req,) = requests_for(served, r.json()["id"])
    assert req.params.max_tokens == 2


def test_chat_streaming(served, http):
    body = {
        "messages": [{"role": "user", "content": "Hi"}],
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    with http.stream("POST", "/v1/chat/completions", json=body) as r:
        assert r.status_code == 200
        events = parse_sse(r.read().decode())
    assert events[-1] == "[DONE]" and events[-2]["usage"]["completion_tokens"] == 3
    chunks = events[:-2]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    assert text == "Hello world!"
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


def test_n2_streaming_chat(served, http):
    body = {"messages": [{"role": "user", "content": "Hi"}], "stream": True, "n": 2}
    with http.stream("POST", "/v1/chat/completions", json=body) as r:
        events = parse_sse(r.read().decode())
    assert events[-1] == "[DONE]"
    for i in (0, 1):
        mine = [e["choices"][0] for e in events[:-1] if e["choices"][0]["index"] == i]
        assert mine[0]["delta"]["role"] == "assistant"
        assert "".join(c["delta"].get("content", "") for c in mine) == "Hello world!"
        assert mine[-1]["finish_reason"] == "stop"


def test_chat_logprobs(served, http):
    r = http.post(
        "/v1/chat/completions",
        json={
            "messages": [{"role": "user", "content": "Hi"}],
            "logprobs": True,
            "top_logprobs": 1,
            "max_tokens": 1,
        },
    )
    assert r.status_code == 200, r.text
    content = r.json()["choices"][0]["logprobs"]["content"]
    assert content == [
        {
            "token": "token_id:11",
            "logprob": -0.5,
            "bytes": None,
            "top_logprobs": [{"token": "token_id:100", "logprob": -0.5, "bytes": None}],
        }
    ]


def test_openai_client(served):
    client = openai.OpenAI(base_url=served.url + "/v1", api_key="x", max_retries=0, timeout=10)
    model = served.config.model_name
    c = client.completions.create(model=model, prompt="Hi", max_tokens=5)
    assert c.choices[0].text == "Hello world!" and c.usage.completion_tokens == 3
    parts = [
        ch.choices[0].text
        for ch in client.completions.create(model=model, prompt="Hi", stream=True)
        if ch.choices
    ]
    assert "".join(parts) == "Hello world!"
    chat = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hi"}])
    assert chat.choices[0].message.content == "Hello world!"
    assert chat.choices[0].finish_reason == "stop"
    stream = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Hi"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert (
        "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == "Hello world!"
    )
    assert chunks[-1].usage.total_tokens == 8
    assert [m.id for m in client.models.list()] == [model]
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="no-such-model", prompt="Hi")
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=model, messages=[{"role": "user", "content": "bad"}])
    assert e.value.body["param"] == "prompt"
