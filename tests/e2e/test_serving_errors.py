"""End to end: bad requests answered as OpenAI-style errors without disturbing a stream,
and clients that go away (their requests aborted, their KV blocks freed)."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.e2e.conftest import CHATS

pytestmark = pytest.mark.timeout(300)


def test_client_disconnect_frees_kv(server):
    body = {
        "prompt": "Write a very long essay.",
        "max_tokens": 4000,
        "stream": True,
        "ignore_eos": True,
    }
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=60) as r:
        assert r.status_code == 200
        lines = r.iter_lines()
        got = [next(lines) for _ in range(6)]
        assert any(x.startswith("data: ") for x in got)
        running = server.metrics()["zeroserve:num_requests_in_flight"]
        assert running >= 1
    # the stream was cut: the request is aborted and its blocks come back
    m = server.wait_idle(timeout_s=10)
    assert m['zeroserve:request_success_total{finished_reason="abort"}'] >= 1


def test_non_streaming_disconnect_frees_kv(server):
    body = {"prompt": "Write a very long essay.", "max_tokens": 4000, "ignore_eos": True}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server.url + "/v1/completions", json=body, timeout=1.5)
    server.wait_idle(timeout_s=10)


@pytest.mark.parametrize(
    "body,status,param,words",
    [
        ({"prompt": "hi " * 9000, "max_tokens": 4}, 400, "prompt", ["8192"]),
        ({"prompt": "hi", "max_tokens": 8192}, 400, "max_tokens", ["8192", "8193"]),
        ({"prompt": "hi", "temperature": -1}, 400, "temperature", ["temperature"]),
        ({"prompt": "hi", "top_p": 0}, 400, "top_p", ["top_p"]),
        ({"prompt": "hi", "model": "gpt-9"}, 404, "model", ["gpt-9"]),
        ({"prompt": [999999]}, 400, "prompt", ["vocabulary"]),
        ({"prompt": ""}, 400, "prompt", ["empty"]),
    ],
)
def test_errors_are_openai_json(server, body, status, param, words):
    r = httpx.post(server.url + "/v1/completions", json=body, timeout=30)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["param"] == param, err
    assert all(w in err["message"] for w in words), err["message"]
    assert err["type"]


def test_errors_when_streaming_are_http_errors(server):
    body = {"prompt": "hi " * 9000, "max_tokens": 4, "stream": True}
    r = httpx.post(server.url + "/v1/completions", json=body, timeout=30)
    assert r.status_code == 400 and "8192" in r.json()["error"]["message"]


def test_malformed_json_and_wrong_shape(server):
    r = httpx.post(
        server.url + "/v1/chat/completions",
        content=b"{not json",
        timeout=10,
        headers={"content-type": "application/json"},
    )
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    r = httpx.post(server.url + "/v1/chat/completions", json={"messages": "hello"}, timeout=10)
    assert r.status_code == 400 and "error" in r.json()


def test_openai_client_sees_errors(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="smollm2", prompt="hi", max_tokens=10, temperature=-2)
    assert "temperature" in str(e.value)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=CHATS[0])


def test_bad_requests_disturb_nothing(server, client):
    """A stream keeps going, token for token, while bad requests are thrown at the server."""
    kwargs = dict(
        model="smollm2",
        prompt="Tell me about the sea.",
        temperature=0,
        max_tokens=48,
        extra_body={"ignore_eos": True},
    )
    alone = client.completions.create(**kwargs).choices[0].text
    stream = client.completions.create(**kwargs, stream=True)
    bad = [
        {"prompt": "hi", "temperature": "hot"},
        {"prompt": "hi " * 9000},
        {"prompt": [10**12]},
        {"messages": [{"role": "user"}]},
    ]
    text = ""
    for i, chunk in enumerate(stream):
        text += chunk.choices[0].text
        if i < len(bad):
            r = httpx.post(server.url + "/v1/completions", json=bad[i], timeout=30)
            assert 400 <= r.status_code < 500, r.text
    assert text == alone
    assert httpx.get(server.url + "/health", timeout=5).status_code == 200
