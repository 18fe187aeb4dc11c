"""Bodies at and past the limits: over 4 MiB (413), fields the API does not have or does not
implement, the limits themselves (served), and a Content-Type other than JSON (415)."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.e2e.api_checks import CHAT, MAX_BODY_BYTES, VOCAB, assert_openai_error
from tests.e2e.hostile_cases import CH, C, G

pytestmark = [pytest.mark.timeout(300), pytest.mark.usefixtures("pids_before")]


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
def test_body_over_limit_is_413(server, chunked):
    """4 MiB + 1 byte: refused from the Content-Length at once, or while reading a
    chunked body, before it is parsed."""
    data = json.dumps({"prompt": "x" * MAX_BODY_BYTES, "max_tokens": 1}).encode()
    assert len(data) > MAX_BODY_BYTES
    content = iter([data[i : i + 65536] for i in range(0, len(data), 65536)]) if chunked else data
    r = httpx.post(
        server.url + "/v1/completions",
        content=content,
        timeout=60,
        headers={"content-type": "application/json"},
    )
    assert r.status_code == 413, r.text[:300]
    err = assert_openai_error(413, r.text)
    assert err["code"] == "request_too_large" and str(MAX_BODY_BYTES) in err["message"], err


@pytest.mark.parametrize(
    "path,obj",
    [
        (C, {"prompt": "hi", "max_tokens": 2}),
        (CH, {"messages": CHAT, "max_tokens": 2}),
        (G, {"prompt": "hi", "max_new_tokens": 2, "stream": False}),
    ],
    ids=["completions", "chat", "generate"],
)
def test_unknown_and_unsupported_fields_are_refused(server, path, obj):
    """Like OpenAI: a field the API does not have is a 400 naming it, and so is an OpenAI
    feature this server does not implement, unless its value asks for nothing."""
    r = httpx.post(
        server.url + path, json={**obj, "frobnicate": {"deep": [1, {"x": None}]}}, timeout=60
    )
    err = assert_openai_error(r.status_code, r.text)
    assert r.status_code == 400 and err["param"] == "frobnicate", r.text
    assert err["message"] == "Unrecognized request argument supplied: frobnicate"
    bias = {"logit_bias": {str(VOCAB): -100}}  # served, but this id is past the vocabulary
    r = httpx.post(server.url + path, json={**obj, **bias}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "logit_bias", r.text
    harmless = {"logit_bias": {}, "user": "u", "store": False, "metadata": {"k": "v"}}
    if path == CH:
        harmless |= {"response_format": {"type": "text"}, "tools": [], "tool_choice": "none"}
    r = httpx.post(server.url + path, json={**obj, **harmless}, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] <= 2


@pytest.mark.parametrize(
    "path,obj",
    [
        (C, {"prompt": "hi", "max_tokens": 2, "seed": 2**64 - 1}),
        (C, {"prompt": "hi", "max_tokens": 2, "seed": -(2**63)}),
        (C, {"prompt": [VOCAB - 1], "max_tokens": 2}),
        (C, {"prompt": "hi", "max_tokens": 2, "logprobs": 20}),
        (CH, {"messages": CHAT, "max_tokens": 2, "n": 8, "logprobs": True, "top_logprobs": 20}),
    ],
    ids=[
        "seed-2**64-1",
        "seed-min-int64",
        "prompt-last-id",
        "logprobs-20",
        "chat-n-8-top_logprobs-20",
    ],
)
def test_limits_themselves_are_accepted(server, path, obj):
    r = httpx.post(server.url + path, json=obj, timeout=60)
    assert r.status_code == 200, r.text


# Content-Type: a body declared as something else than JSON is refused with 415 (as in
# FastAPI's fix for CVE-2021-32677: a web page can POST text/plain or a form cross-origin
# without a CORS preflight, so any site a user visits could drive a local server
# without an API key). A missing Content-Type is parsed as JSON (tests/frontend/test_errors.py).
JSON_BODIES = {
    C: {"prompt": "hi", "max_tokens": 2},
    CH: {"messages": CHAT, "max_tokens": 2},
    G: {"prompt": "hi", "max_new_tokens": 2, "stream": False},
}


@pytest.mark.parametrize("path", list(JSON_BODIES), ids=["completions", "chat", "generate"])
@pytest.mark.parametrize(
    "content_type,status",
    [
        ("application/json", 200),
        ("application/json; charset=utf-8", 200),
        ("Application/JSON", 200),
        ("text/plain", 415),
        ("application/x-www-form-urlencoded", 415),
    ],
)
def test_content_type(server, path, content_type, status):
    r = httpx.post(
        server.url + path,
        content=json.dumps(JSON_BODIES[path]).encode(),
        headers={"content-type": content_type},
        timeout=60,
    )
    assert r.status_code == status, r.text[:300]
    if status >= 400:
        assert "content-type" in assert_openai_error(status, r.text)["message"].lower()


@pytest.mark.parametrize(
    "content_type", ["text/plain", "application/x-www-form-urlencoded", "application/xml"]
)
def test_content_type_handled_alike_everywhere(server, content_type):
    """Whatever the answer to a non-JSON Content-Type is, the three endpoints agree."""
    statuses = {
        path: httpx.post(
            server.url + path,
            content=json.dumps(obj).encode(),
            headers={"content-type": content_type},
            timeout=60,
        ).status_code
        for path, obj in JSON_BODIES.items()
    }
    assert len(set(statuses.values())) == 1, statuses


def test_a_client_gone_mid_body_is_no_server_error(server):
    """A client that declares 1,000 bytes, sends a few and closes: nothing logs a traceback
    (a stream of such clients would flood the log), and the server serves on."""
    import socket
    import time

    before = server.log().count("Traceback")
    for _ in range(3):
        with socket.create_connection(("127.0.0.1", server.port)) as s:
            s.sendall(
                b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                b'Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{"model":'
            )
            time.sleep(0.3)
    body = {"messages": CHAT, "max_tokens": 2}
    r = httpx.post(server.url + CH, json=body, timeout=60)
    assert r.status_code == 200, r.text[:300]
    time.sleep(0.5)
    log = server.log()
    assert log.count("Traceback") == before, log[-3000:]
    assert "unhandled error" not in log
