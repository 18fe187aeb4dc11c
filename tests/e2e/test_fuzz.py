"""Fuzzing the HTTP API. Whatever arrives, the server answers < 500, every 4xx is an
OpenAI-style error naming what was wrong, and afterwards it still serves, no worker
restarted and every KV block is free again.

1. schemathesis against the server's own /openapi.json: every operation, bodies that fit
   the schema and (for the POST bodies) bodies that do not: wrong types, missing fields,
   raw non-JSON bytes.
2. Hypothesis bodies inside every documented range: each must generate (200).
3. Hand-written hostile requests, each with its exact status and the parameter / limit
   the error must name.

Reproducible (a fixed Hypothesis seed, no example database) and bounded: MAX_EXAMPLES
cases per operation and mode, every generation capped at MAX_GEN_TOKENS output tokens
before it is sent, so an accepted body cannot run long. `-s` prints the status counts.

The schemathesis operations are listed here (test ids are needed at collection, when no
server runs); test_schema_lists_every_route fails when /openapi.json gains one. (The
pytest integration `schemathesis.pytest.from_fixture(...).parametrize()` is not used:
with pytest 9.2 it fails with "'Function' object has no attribute '_nodeid'".)
"""

from __future__ import annotations

import json
import math
import time
from collections import Counter
from typing import Any

import httpx
import hypothesis
import pytest
import schemathesis
from hypothesis import strategies as st
from schemathesis import GenerationMode

from tests.e2e.conftest import start_server

pytestmark = pytest.mark.timeout(300)

SEED = 20240917
MAX_EXAMPLES = 25
MAX_GEN_TOKENS = 8
# the fields that set a generation's length; when absent the server's default (16 / 256 /
# 64 tokens) applies, so they are set then too, to keep every case cheap
LENGTH_FIELDS = {
    "/v1/completions": ("max_tokens",),
    "/v1/chat/completions": ("max_tokens", "max_completion_tokens"),
    "/generate": ("max_new_tokens",),
}
OPERATIONS = [("POST", "/v1/completions"), ("POST", "/v1/chat/completions"),
              ("POST", "/generate"), ("GET", "/v1/models"), ("GET", "/v1/models/{model}"),
              ("GET", "/health"), ("GET", "/metrics")]  # fmt: skip
# negative (schema-violating) data exists only for the JSON bodies: a GET's path string
# cannot violate {"type": "string"}
FUZZ_CASES = [(m, p, GenerationMode.POSITIVE) for m, p in OPERATIONS] + \
             [(m, p, GenerationMode.NEGATIVE) for m, p in OPERATIONS if m == "POST"]  # fmt: skip
MAX_BODY_BYTES = 4 << 20  # ServerConfig.max_body_bytes
CONTEXT = 8192  # the default model's max_model_len
VOCAB = 49152  # the default model's vocabulary
CHAT = [{"role": "user", "content": "hi"}]
HYPOTHESIS = dict(max_examples=MAX_EXAMPLES, deadline=None, database=None, derandomize=False,
                  suppress_health_check=list(hypothesis.HealthCheck),
                  phases=[hypothesis.Phase.explicit, hypothesis.Phase.generate])  # fmt: skip


# -- helpers ----------------------------------------------------------------------------------
def assert_openai_error(status: int, text: str, where: str = "") -> dict[str, Any]:
    """A 4xx body is `{"error": {"message": str, "type": str, ...}}`; returns the error."""
    try:
        body = json.loads(text)
    except ValueError:
        raise AssertionError(f"{where}: {status} body is not JSON: {text[:300]!r}") from None
    assert isinstance(body, dict) and isinstance(body.get("error"), dict), (
        f"{where}: {status} body is not an OpenAI error: {text[:300]!r}"
    )
    err = body["error"]
    assert isinstance(err.get("message"), str) and err["message"], f"{where}: {err}"
    assert isinstance(err.get("type"), str) and err["type"], f"{where}: {err}"
    return err


def bound_generation(path: str, body: Any) -> None:
    """Cap, in place, the output length a generated body asks for (or gets by default) at
    MAX_GEN_TOKENS. Values the server rejects anyway (<= 0, wrong type) are left alone;
    numeric strings are capped too, in case the schema ever turns lax ("4000" as 4000)."""
    if not isinstance(body, dict):
        return
    for name in LENGTH_FIELDS.get(path, ()):
        value = body.get(name)
        if value is None:
            body[name] = MAX_GEN_TOKENS
            continue
        if isinstance(value, bool):
            continue
        number = value
        if isinstance(value, str):
            try:
                number = float(value.strip())
            except ValueError:
                continue
        if isinstance(number, (int, float)) and (math.isnan(number) or number > MAX_GEN_TOKENS):
            body[name] = MAX_GEN_TOKENS


def assert_serves(server) -> None:
    r = httpx.post(
        server.url + "/v1/completions",
        timeout=60,
        json={"prompt": "A normal request", "max_tokens": 4, "ignore_eos": True},
    )
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 4


def assert_intact(server, pids_before: list[int]) -> None:
    assert httpx.get(server.url + "/health", timeout=5).status_code == 200
    assert_serves(server)
    assert sorted(server.pids()) == pids_before, "a server process died or was restarted"
    server.wait_idle(timeout_s=15)


@pytest.fixture(scope="module", autouse=True)
def pids_before(server) -> list[int]:
    """The server's processes when this module starts (the server is shared with the rest
    of the session, so the snapshot is taken here, not at launch)."""
    pids = sorted(server.pids())
    assert len(pids) >= 5, pids  # frontend, 2 tokenizers, scheduler, detok
    return pids


# -- 1. schemathesis --------------------------------------------------------------------------
@pytest.fixture(scope="module")
def api_schema(server) -> schemathesis.BaseSchema:
    return schemathesis.openapi.from_url(server.url + "/openapi.json")


def test_schema_lists_every_route(api_schema):
    ops = {(m.upper(), p) for p, item in api_schema.raw_schema["paths"].items() for m in item}
    assert ops == set(OPERATIONS), "fuzz the new operations too (OPERATIONS)"
    for path in LENGTH_FIELDS:  # the generation bodies are described, so they are fuzzed
        body = api_schema.raw_schema["paths"][path]["post"]["requestBody"]
        assert body["content"]["application/json"]["schema"]["properties"]


@pytest.mark.parametrize("method,path,mode", FUZZ_CASES,
                         ids=[f"{m} {p} {mode.value}" for m, p, mode in FUZZ_CASES])  # fmt: skip
def test_schemathesis(server, api_schema, method, path, mode):
    """Never a 5xx; every 4xx an OpenAI error."""
    operation = api_schema[path][method]
    statuses: Counter[int] = Counter()
    slowest: list[Any] = [0.0, None]

    @hypothesis.settings(**HYPOTHESIS)
    @hypothesis.seed(SEED)
    @hypothesis.given(case=operation.as_strategy(generation_mode=mode))
    def fuzz(case):
        bound_generation(path, case.body)
        t0 = time.monotonic()
        response = case.call(timeout=60)
        elapsed = time.monotonic() - t0
        statuses[response.status_code] += 1
        where = f"{case.method} {case.formatted_path} body={case.body!r:.400}"
        if elapsed > slowest[0]:
            slowest[:] = [elapsed, f"{response.status_code} {where:.200}"]
        assert response.status_code < 500, f"{where}: {response.status_code} {response.text[:500]}"
        if response.status_code >= 400:
            assert_openai_error(response.status_code, response.text, where)

    fuzz()
    print(f"\n{method} {path} {mode.value}: statuses {dict(sorted(statuses.items()))}; "
          f"slowest {slowest[0]:.2f} s: {slowest[1]}")  # fmt: skip
    assert statuses


def test_intact_after_schemathesis(server, pids_before):
    assert_intact(server, pids_before)


# -- 2. valid bodies, in-range parameters: every one must generate ----------------------------
# schemathesis knows the types only, so most of its bodies are out of range (400); these
# stay inside every documented range, to shake the sampler with odd combinations
# (down to the smallest positive floats: see test_extreme_sampling_params_are_served).


def _floats(lo: float, hi: float, **kw) -> st.SearchStrategy[float]:
    return st.floats(lo, hi, allow_nan=False, allow_infinity=False, **kw)


_text = st.text(st.characters(codec="utf-8"), min_size=1, max_size=24)
_SAMPLING = {
    "temperature": _floats(0, 2), "top_p": _floats(0, 1, exclude_min=True),
    "top_k": st.integers(-1, 2 * VOCAB), "min_p": _floats(0, 1),
    "repetition_penalty": _floats(0, 10, exclude_min=True),
    "presence_penalty": _floats(-2, 2), "frequency_penalty": _floats(-2, 2),
    "seed": st.integers(-(2**63), 2**64 - 1),
    "stop": st.one_of(_text, st.lists(_text, max_size=16)),
    "stop_token_ids": st.lists(st.integers(0, VOCAB - 1), max_size=64),
    "ignore_eos": st.booleans(), "skip_special_tokens": st.booleans(),
    "include_stop_str_in_output": st.booleans(), "min_tokens": st.integers(0, MAX_GEN_TOKENS),
    "user": st.text(max_size=8), "return_timings": st.booleans(),
    "model": st.sampled_from(["smollm2", None]), "stream": st.booleans(),
    "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()}),
}  # fmt: skip
_OPENAI = {**_SAMPLING, "n": st.integers(1, 8)}
_ids = st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=24)
_message = st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "user", "assistant"]),
     "content": st.one_of(st.none(), _text, st.lists(st.fixed_dictionaries(
         {"type": st.just("text"), "text": _text}), max_size=3))},
    optional={"name": _text})  # fmt: skip
VALID_BODIES = {
    "/v1/completions": st.fixed_dictionaries(
        {"prompt": st.one_of(_text, _ids, st.lists(_text, min_size=1, max_size=1),
                             st.lists(_ids, min_size=1, max_size=1)),
         "max_tokens": st.integers(1, MAX_GEN_TOKENS)},
        optional={**_OPENAI, "logprobs": st.integers(0, 20), "echo": st.just(False)}),
    "/v1/chat/completions": st.fixed_dictionaries(
        {"messages": st.lists(_message, min_size=1, max_size=4),
         "max_tokens": st.integers(1, MAX_GEN_TOKENS)},
        optional={**_OPENAI, "max_completion_tokens": st.integers(1, MAX_GEN_TOKENS),
                  "logprobs": st.booleans(), "top_logprobs": st.integers(0, 20)}),
    "/generate": st.fixed_dictionaries(
        {"prompt": _text, "max_new_tokens": st.integers(1, MAX_GEN_TOKENS)}, optional=_SAMPLING),
}  # fmt: skip


def _length(path: str, body: dict[str, Any]) -> int:
    if path == "/generate":
        return body["max_new_tokens"]
    return body.get("max_completion_tokens") or body["max_tokens"]  # the newer name wins


def _fix_up(path: str, body: dict[str, Any]) -> dict[str, Any]:
    """The cross-field rules: top_logprobs needs logprobs; min_tokens <= the length."""
    if "top_logprobs" in body:
        body["logprobs"] = True
    if "min_tokens" in body:
        body["min_tokens"] = min(body["min_tokens"], _length(path, body))
    return body


def _sse_payloads(text: str) -> list[Any]:
    events = [e for e in text.split("\n\n") if e.strip()]
    assert events and events[-1] == "data: [DONE]", text[-300:]
    return [json.loads(e.removeprefix("data: ")) for e in events[:-1]]


@pytest.mark.parametrize("path", list(VALID_BODIES))
def test_valid_bodies_generate(server, path):
    """200; n choices, each finished; at most n * max_tokens tokens (exactly that with
    ignore_eos and nothing that stops early); a stream ends with [DONE], no error event."""
    client = httpx.Client(timeout=60)
    statuses: Counter[str] = Counter()

    @hypothesis.settings(**HYPOTHESIS)
    @hypothesis.seed(SEED)
    @hypothesis.given(body=VALID_BODIES[path].map(lambda b: _fix_up(path, b)))
    def fuzz(body):
        r = client.post(server.url + path, json=body)
        statuses[str(r.status_code)] += 1
        assert r.status_code == 200, f"{body!r}: {r.status_code} {r.text[:500]}"
        if path == "/generate":
            if body.get("stream") is False:
                assert r.json()["finish_reason"] in ("stop", "length"), r.text
            return
        n, length = body.get("n", 1), _length(path, body)
        if body.get("stream"):
            chunks = _sse_payloads(r.text)
            assert not any("error" in c for c in chunks), r.text[-500:]
            finals = [c["choices"][0]["finish_reason"] for c in chunks
                      if c["choices"] and c["choices"][0]["finish_reason"]]  # fmt: skip
            assert len(finals) == n, r.text[-500:]
            usage = chunks[-1].get("usage")
            assert (usage is not None) == bool(body.get("stream_options", {}).get("include_usage"))
        else:
            out = r.json()
            assert sorted(c["index"] for c in out["choices"]) == list(range(n))
            assert all(c["finish_reason"] in ("stop", "length") for c in out["choices"])
            usage = out["usage"]
        if usage is not None:
            assert usage["completion_tokens"] <= n * length, (body, usage)
            if body.get("ignore_eos") and not body.get("stop") and not body.get("stop_token_ids"):
                assert usage["completion_tokens"] == n * length, (body, usage)

    with client:
        fuzz()
    print(f"\nvalid bodies on {path}: {dict(statuses)}")


def test_intact_after_valid_bodies(server, pids_before):
    assert_intact(server, pids_before)


# -- 3. hand-written hostile requests ---------------------------------------------------------
def raw(path: str, content: bytes, status: int, param: str | None, *words: str,
        marks=(), id: str) -> Any:  # fmt: skip
    return pytest.param(path, content, status, param, words, marks=marks, id=id)


def body(path: str, obj: dict[str, Any], status: int, param: str | None, *words: str,
         marks=(), id: str) -> Any:  # fmt: skip
    return raw(path, json.dumps(obj).encode(), status, param, *words, marks=marks, id=id)


C, CH, G = "/v1/completions", "/v1/chat/completions", "/generate"
SMALL = {"max_tokens": 2}
BIG_INT = 2**64  # one past the largest unsigned 64-bit integer


HOSTILE = [
    # encoding and framing
    raw(C, b'{"prompt": "hi \xff\xfe", "max_tokens": 2}', 400, None, "Invalid JSON",
        id="invalid-utf8-in-string"),
    raw(CH, b'{"messages": [{"role": "user", "content": "\xc3\x28"}], "max_tokens": 2}', 400,
        None, "Invalid JSON", id="invalid-utf8-chat"),
    raw(G, b'\xff\xfe{"prompt": "hi"}', 400, None, "Invalid JSON", id="invalid-utf8-before-json"),
    raw(C, b'{"prompt": "\\ud800", "max_tokens": 2}', 400, None, "Invalid JSON",
        id="lone-surrogate-escape"),
    raw(C, b'{"prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", 400, None, "Invalid JSON",
        id="nested-100k-deep"),
    raw(C, b"", 400, None, "Invalid JSON", id="empty-body"),
    raw(C, b"[1, 2]", 400, None, "object", id="json-array-body"),
    # messages of the wrong shape
    body(CH, {"messages": "hello"}, 400, "messages", "array", id="messages-string"),
    body(CH, {"messages": ["hello", "there"]}, 400, "messages.0", id="messages-list-of-strings"),
    body(CH, {"messages": [{"content": "hello"}]}, 400, "messages.0.role", "required",
         id="message-without-role"),
    body(CH, {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "http://example.com/a.png"}}]}]},
         400, "messages.0.content", "image_url", id="content-part-image"),
    body(CH, {"messages": []}, 400, "messages", "empty", id="messages-empty"),
    # output length
    body(C, {"prompt": "hi", "max_tokens": 0}, 400, "max_tokens", ">= 1", id="max_tokens-0"),
    body(C, {"prompt": "hi", "max_tokens": -5}, 400, "max_tokens", ">= 1", id="max_tokens-neg"),
    body(C, {"prompt": "hi", "max_tokens": CONTEXT}, 400, "max_tokens", str(CONTEXT),
         id="max_tokens-context"),
    body(CH, {"messages": CHAT, "max_tokens": 0}, 400, "max_tokens", ">= 1",
         id="chat-max_tokens-0"),
    body(CH, {"messages": CHAT, "max_tokens": -5}, 400, "max_tokens", ">= 1",
         id="chat-max_tokens-neg"),
    body(CH, {"messages": CHAT, "max_tokens": CONTEXT}, 400, "max_tokens", str(CONTEXT),
         id="chat-max_tokens-context"),
    body(CH, {"messages": CHAT, "max_completion_tokens": 0}, 400, "max_completion_tokens",
         ">= 1", id="chat-max_completion_tokens-0"),
    body(G, {"prompt": "hi", "max_new_tokens": 0}, 400, "max_new_tokens", ">= 1", id="generate-max_new_tokens-0"),
    body(G, {"prompt": "hi", "max_new_tokens": CONTEXT}, 400, "max_new_tokens", str(CONTEXT), id="generate-max_new_tokens-context"),
    # server limits
    body(C, {"prompt": "hi", **SMALL, "n": 9}, 400, "n", "8", id="n-9"),
    body(CH, {"messages": CHAT, **SMALL, "n": 9}, 400, "n", "8", id="chat-n-9"),
    body(C, {"prompt": "hi", **SMALL, "logprobs": 21}, 400, "logprobs", "20", id="logprobs-21"),
    body(CH, {"messages": CHAT, **SMALL, "logprobs": True, "top_logprobs": 21}, 400,
         "top_logprobs", "20", id="chat-top_logprobs-21"),
    body(C, {"prompt": "hi", **SMALL, "stop": [f"s{i}" for i in range(17)]}, 400, "stop", "16",
         id="stop-17"),
    body(CH, {"messages": CHAT, **SMALL, "stop": [f"s{i}" for i in range(17)]}, 400, "stop",
         "16", id="chat-stop-17"),
    # non-finite floats: Python's json writes NaN / Infinity literals; 1e400 overflows
    raw(C, b'{"prompt": "hi", "max_tokens": 2, "temperature": NaN}', 400, "temperature",
        "finite", id="temperature-NaN"),
    raw(C, b'{"prompt": "hi", "max_tokens": 2, "top_p": NaN}', 400, "top_p", "finite",
        id="top_p-NaN"),
    raw(CH, b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, '
            b'"temperature": Infinity}', 400, "temperature", "finite", id="chat-temperature-inf"),
    raw(C, b'{"prompt": "hi", "max_tokens": 2, "temperature": -Infinity}', 400, "temperature",
        "finite", id="temperature-minus-inf"),
    raw(C, b'{"prompt": "hi", "max_tokens": 2, "temperature": 1e400}', 400, "temperature",
        "finite", id="temperature-1e400"),
    raw(G, b'{"prompt": "hi", "max_new_tokens": 2, "top_p": 1e400}', 400, "top_p", "finite",
        id="generate-top_p-1e400"),
    # token ids
    body(C, {"prompt": [1, VOCAB], **SMALL}, 400, "prompt", "vocabulary", str(VOCAB),
         id="prompt-id-vocab"),
    body(C, {"prompt": [[VOCAB]], **SMALL}, 400, "prompt", "vocabulary", id="prompt-batch1-vocab"),
    body(C, {"prompt": [2**31], **SMALL}, 400, "prompt", id="prompt-id-2**31"),
    body(C, {"prompt": [-1], **SMALL}, 400, "prompt", ">= 0", id="prompt-id-negative"),
    # seeds: 64 bits (signed or unsigned)
    body(C, {"prompt": "hi", **SMALL, "seed": 2**64}, 400, "seed", "64-bit", id="seed-2**64"),
    body(C, {"prompt": "hi", **SMALL, "seed": -(2**63) - 1}, 400, "seed", "64-bit",
         id="seed-below-int64"),
    body(C, {"prompt": "hi", **SMALL, "seed": 10**30}, 400, "seed", id="seed-10**30"),
    # integers beyond any wire type
    body(C, {"prompt": "hi", "max_tokens": BIG_INT}, 400, "max_tokens",
         id="max_tokens-2**64"),
    body(G, {"prompt": "hi", "max_new_tokens": BIG_INT}, 400, "max_new_tokens", id="generate-max_new_tokens-2**64"),
    body(C, {"prompt": "hi", **SMALL, "top_k": BIG_INT}, 400, "top_k",
         id="top_k-2**64"),
    body(C, {"prompt": "hi", **SMALL, "stop_token_ids": [BIG_INT]}, 400, "stop_token_ids", id="stop_token_ids-2**64"),
    body(C, {"prompt": "hi", **SMALL, "stop_token_ids": [VOCAB]}, 400, "stop_token_ids",
         "vocabulary", id="stop_token_ids-vocab"),
]  # fmt: skip


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


@pytest.mark.parametrize("path,obj", [
    (C, {"prompt": "hi", "max_tokens": 2}),
    (CH, {"messages": CHAT, "max_tokens": 2}),
    (G, {"prompt": "hi", "max_new_tokens": 2, "stream": False}),
], ids=["completions", "chat", "generate"])  # fmt: skip
def test_unknown_and_unsupported_fields_are_refused(server, path, obj):
    """Like OpenAI: a field the API does not have is a 400 naming it, and so is an OpenAI
    feature this server does not implement, unless its value asks for nothing."""
    r = httpx.post(server.url + path, json={**obj, "frobnicate": {"deep": [1, {"x": None}]}},
                   timeout=60)  # fmt: skip
    err = assert_openai_error(r.status_code, r.text)
    assert r.status_code == 400 and err["param"] == "frobnicate", r.text
    assert err["message"] == "Unrecognized request argument supplied: frobnicate"
    r = httpx.post(server.url + path, json={**obj, "logit_bias": {"50256": -100}}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "logit_bias", r.text
    harmless = {"logit_bias": {}, "user": "u", "store": False, "metadata": {"k": "v"}}
    if path == CH:
        harmless |= {"response_format": {"type": "text"}, "tools": [], "tool_choice": "none"}
    r = httpx.post(server.url + path, json={**obj, **harmless}, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] <= 2


@pytest.mark.parametrize("path,obj", [(C, {"prompt": "hi", "max_tokens": 2, "seed": 2**64 - 1}),
                                      (C, {"prompt": "hi", "max_tokens": 2, "seed": -(2**63)}),
                                      (C, {"prompt": [VOCAB - 1], "max_tokens": 2}),
                                      (C, {"prompt": "hi", "max_tokens": 2, "logprobs": 20}),
                                      (CH, {"messages": CHAT, "max_tokens": 2, "n": 8,
                                            "logprobs": True, "top_logprobs": 20})],
                         ids=["seed-2**64-1", "seed-min-int64", "prompt-last-id", "logprobs-20",
                              "chat-n-8-top_logprobs-20"])  # fmt: skip
def test_limits_themselves_are_accepted(server, path, obj):
    r = httpx.post(server.url + path, json=obj, timeout=60)
    assert r.status_code == 200, r.text


# Content-Type: a body declared as something else than JSON is refused with 415 (as in
# FastAPI's fix for CVE-2021-32677: a web page can POST text/plain or a form cross-origin
# without a CORS preflight, so any site a user visits could drive a local server
# without an API key). A missing Content-Type is parsed as JSON (test_api covers it).
JSON_BODIES = {C: {"prompt": "hi", "max_tokens": 2}, CH: {"messages": CHAT, "max_tokens": 2},
               G: {"prompt": "hi", "max_new_tokens": 2, "stream": False}}  # fmt: skip


@pytest.mark.parametrize("path", list(JSON_BODIES), ids=["completions", "chat", "generate"])
@pytest.mark.parametrize("content_type,status", [
    ("application/json", 200),
    ("application/json; charset=utf-8", 200),
    ("Application/JSON", 200),
    ("text/plain", 415),
    ("application/x-www-form-urlencoded", 415),
])  # fmt: skip
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
    statuses = {path: httpx.post(server.url + path, content=json.dumps(obj).encode(),
                                 headers={"content-type": content_type}, timeout=60).status_code
                for path, obj in JSON_BODIES.items()}  # fmt: skip
    assert len(set(statuses.values())) == 1, statuses


def test_intact_after_hostile_requests(server, pids_before):
    assert_intact(server, pids_before)


# -- valid requests that kill the scheduler: on a private server -----------------------------
@pytest.fixture(scope="module")
def private_server(default_model_dir):
    s = start_server(workers=1)
    yield s
    s.stop()


@pytest.mark.parametrize("params", [{"top_p": 1e-46},
                                    {"repetition_penalty": 1e-38, "top_p": 0.9}],
                         ids=["top_p-1e-46", "repetition_penalty-1e-38"])  # fmt: skip
def test_extreme_sampling_params_are_served(private_server, params):
    """In range (top_p in (0, 1], repetition_penalty > 0), so it must generate; refusing
    it with a 400 would do too, but a dead scheduler must not."""
    deadline = time.monotonic() + 60  # a previous case may have killed the scheduler
    while httpx.get(private_server.url + "/health", timeout=5).status_code != 200:
        assert time.monotonic() < deadline, "the private server did not come back"
        time.sleep(0.2)
    pids = sorted(private_server.pids())
    r = httpx.post(private_server.url + "/v1/completions", timeout=60,
                   json={"prompt": "hi hi hi", "max_tokens": 2, **params})  # fmt: skip
    assert r.status_code in (200, 400), r.text
    assert sorted(private_server.pids()) == pids, "a server process died"
