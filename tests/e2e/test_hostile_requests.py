"""Hand-written hostile requests, each with its exact status and the parameter / limit
the error must name; afterwards the server still serves, no worker restarted and every
KV block is free again (tests/e2e/api_checks.py). Schema-driven fuzzing: test_fuzz.py.
"""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import pytest

from tests.e2e.api_checks import (
    CHAT,
    CONTEXT,
    MAX_BODY_BYTES,
    VOCAB,
    assert_intact,
    assert_openai_error,
)
from tests.e2e.conftest import start_server

pytestmark = [pytest.mark.timeout(300), pytest.mark.usefixtures("pids_before")]


# -- hand-written hostile requests ------------------------------------------------------------
def raw(
    path: str, content: bytes, status: int, param: str | None, *words: str, marks=(), id: str
) -> Any:
    return pytest.param(path, content, status, param, words, marks=marks, id=id)


def body(
    path: str, obj: dict[str, Any], status: int, param: str | None, *words: str, marks=(), id: str
) -> Any:
    return raw(path, json.dumps(obj).encode(), status, param, *words, marks=marks, id=id)


C, CH, G = "/v1/completions", "/v1/chat/completions", "/generate"
SMALL = {"max_tokens": 2}
BIG_INT = 2**64  # one past the largest unsigned 64-bit integer


HOSTILE = [
    # encoding and framing
    raw(
        C,
        b'{"prompt": "hi \xff\xfe", "max_tokens": 2}',
        400,
        None,
        "Invalid JSON",
        id="invalid-utf8-in-string",
    ),
    raw(
        CH,
        b'{"messages": [{"role": "user", "content": "\xc3\x28"}], "max_tokens": 2}',
        400,
        None,
        "Invalid JSON",
        id="invalid-utf8-chat",
    ),
    raw(G, b'\xff\xfe{"prompt": "hi"}', 400, None, "Invalid JSON", id="invalid-utf8-before-json"),
    raw(
        C,
        b'{"prompt": "\\ud800", "max_tokens": 2}',
        400,
        None,
        "Invalid JSON",
        id="lone-surrogate-escape",
    ),
    raw(
        C,
        b'{"prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
        400,
        None,
        "Invalid JSON",
        id="nested-100k-deep",
    ),
    raw(C, b"", 400, None, "Invalid JSON", id="empty-body"),
    raw(C, b"[1, 2]", 400, None, "object", id="json-array-body"),
    # messages of the wrong shape
    body(CH, {"messages": "hello"}, 400, "messages", "array", id="messages-string"),
    body(CH, {"messages": ["hello", "there"]}, 400, "messages.0", id="messages-list-of-strings"),
    body(
        CH,
        {"messages": [{"content": "hello"}]},
        400,
        "messages.0.role",
        "required",
        id="message-without-role",
    ),
    body(
        CH,
        {
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "image_url", "image_url": {"url": "http://example.com/a.png"}}
                    ],
                }
            ]
        },
        400,
        "messages.0.content",
        "image_url",
        id="content-part-image",
    ),
    body(CH, {"messages": []}, 400, "messages", "empty", id="messages-empty"),
    # output length
    body(C, {"prompt": "hi", "max_tokens": 0}, 400, "max_tokens", ">= 1", id="max_tokens-0"),
    body(C, {"prompt": "hi", "max_tokens": -5}, 400, "max_tokens", ">= 1", id="max_tokens-neg"),
    body(
        C,
        {"prompt": "hi", "max_tokens": CONTEXT},
        400,
        "max_tokens",
        str(CONTEXT),
        id="max_tokens-context",
    ),
    body(
        CH, {"messages": CHAT, "max_tokens": 0}, 400, "max_tokens", ">= 1", id="chat-max_tokens-0"
    ),
    body(
        CH,
        {"messages": CHAT, "max_tokens": -5},
        400,
        "max_tokens",
        ">= 1",
        id="chat-max_tokens-neg",
    ),
    body(
        CH,
        {"messages": CHAT, "max_tokens": CONTEXT},
        400,
        "max_tokens",
        str(CONTEXT),
        id="chat-max_tokens-context",
    ),
    body(
        CH,
        {"messages": CHAT, "max_completion_tokens": 0},
        400,
        "max_completion_tokens",
        ">= 1",
        id="chat-max_completion_tokens-0",
    ),
    body(
        G,
        {"prompt": "hi", "max_new_tokens": 0},
        400,
        "max_new_tokens",
        ">= 1",
        id="generate-max_new_tokens-0",
    ),
    body(
        G,
        {"prompt": "hi", "max_new_tokens": CONTEXT},
        400,
        "max_new_tokens",
        str(CONTEXT),
        id="generate-max_new_tokens-context",
    ),
    # server limits
    body(C, {"prompt": "hi", **SMALL, "n": 9}, 400, "n", "8", id="n-9"),
    body(CH, {"messages": CHAT, **SMALL, "n": 9}, 400, "n", "8", id="chat-n-9"),
    body(C, {"prompt": "hi", **SMALL, "logprobs": 21}, 400, "logprobs", "20", id="logprobs-21"),
    body(
        CH,
        {"messages": CHAT, **SMALL, "logprobs": True, "top_logprobs": 21},
        400,
        "top_logprobs",
        "20",
        id="chat-top_logprobs-21",
    ),
    body(
        C,
        {"prompt": "hi", **SMALL, "stop": [f"s{i}" for i in range(17)]},
        400,
        "stop",
        "16",
        id="stop-17",
    ),
    body(
        CH,
        {"messages": CHAT, **SMALL, "stop": [f"s{i}" for i in range(17)]},
        400,
        "stop",
        "16",
        id="chat-stop-17",
    ),
    # non-finite floats: Python's json writes NaN / Infinity literals; 1e400 overflows
    raw(
        C,
        b'{"prompt": "hi", "max_tokens": 2, "temperature": NaN}',
        400,
        "temperature",
        "finite",
        id="temperature-NaN",
    ),
    raw(
        C,
        b'{"prompt": "hi", "max_tokens": 2, "top_p": NaN}',
        400,
        "top_p",
        "finite",
        id="top_p-NaN",
    ),
    raw(
        CH,
        b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, '
        b'"temperature": Infinity}',
        400,
        "temperature",
        "finite",
        id="chat-temperature-inf",
    ),
    raw(
        C,
        b'{"prompt": "hi", "max_tokens": 2, "temperature": -Infinity}',
        400,
        "temperature",
        "finite",
        id="temperature-minus-inf",
    ),
    raw(
        C,
        b'{"prompt": "hi", "max_tokens": 2, "temperature": 1e400}',
        400,
        "temperature",
        "finite",
        id="temperature-1e400",
    ),
    raw(
        G,
        b'{"prompt": "hi", "max_new_tokens": 2, "top_p": 1e400}',
        400,
        "top_p",
        "finite",
        id="generate-top_p-1e400",
    ),
    # token ids
    body(
        C,
        {"prompt": [1, VOCAB], **SMALL},
        400,
        "prompt",
        "vocabulary",
        str(VOCAB),
        id="prompt-id-vocab",
    ),
    body(C, {"prompt": [[VOCAB]], **SMALL}, 400, "prompt", "vocabulary", id="prompt-batch1-vocab"),
    body(C, {"prompt": [2**31], **SMALL}, 400, "prompt", id="prompt-id-2**31"),
    body(C, {"prompt": [-1], **SMALL}, 400, "prompt", ">= 0", id="prompt-id-negative"),
    # seeds: 64 bits (signed or unsigned)
    body(C, {"prompt": "hi", **SMALL, "seed": 2**64}, 400, "seed", "64-bit", id="seed-2**64"),
    body(
        C,
        {"prompt": "hi", **SMALL, "seed": -(2**63) - 1},
        400,
        "seed",
        "64-bit",
        id="seed-below-int64",
    ),
    body(C, {"prompt": "hi", **SMALL, "seed": 10**30}, 400, "seed", id="seed-10**30"),
    # integers beyond any wire type
    body(C, {"prompt": "hi", "max_tokens": BIG_INT}, 400, "max_tokens", id="max_tokens-2**64"),
    body(
        G,
        {"prompt": "hi", "max_new_tokens": BIG_INT},
        400,
        "max_new_tokens",
        id="generate-max_new_tokens-2**64",
    ),
    body(C, {"prompt": "hi", **SMALL, "top_k": BIG_INT}, 400, "top_k", id="top_k-2**64"),
    body(
        C,
        {"prompt": "hi", **SMALL, "stop_token_ids": [BIG_INT]},
        400,
        "stop_token_ids",
        id="stop_token_ids-2**64",
    ),
    body(
        C,
        {"prompt": "hi", **SMALL, "stop_token_ids": [VOCAB]},
        400,
        "stop_token_ids",
        "vocabulary",
        id="stop_token_ids-vocab",
    ),
]


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
# without an API key). A missing Content-Type is parsed as JSON (test_api covers it).
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
