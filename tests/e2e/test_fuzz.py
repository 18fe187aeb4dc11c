"""Fuzzing the HTTP API. Whatever arrives, the server answers < 500, every 4xx is an
OpenAI-style error naming what was wrong, and afterwards it still serves, no worker
restarted and every KV block is free again.

1. schemathesis against the server's own /openapi.json: every operation, bodies that fit
   the schema and (for the POST bodies) bodies that do not: wrong types, missing fields,
   raw non-JSON bytes.
2. Hypothesis bodies inside every documented range: each must generate (200).
(Hand-written hostile requests: test_hostile_requests.py.)

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

from tests.e2e.api_checks import (
    VOCAB,
    assert_intact,
    assert_openai_error,
)

pytestmark = [pytest.mark.timeout(300), pytest.mark.usefixtures("pids_before")]


SEED = 20240917
MAX_EXAMPLES = 25
MAX_GEN_TOKENS = 8
# the fields that set a generation's length; when absent the server's default (16 / 256 /
# 64 tokens) applies, so they are set then too, to keep every case cheap
LENGTH_FIELDS = {
    "/v1/completions": ("max_tokens",),
    "/v1/chat/completions": ("max_tokens", "max_completion_tokens"),
    "/generate": ("max_new_tokens",),
    "/v1/messages": ("max_tokens",),
    "/v1/responses": ("max_output_tokens",),
}
# bodies whose `model` is required (Anthropic's): valid ones name the served model
MODEL_REQUIRED = ("/v1/messages", "/v1/messages/count_tokens")
OPERATIONS = [
    ("POST", "/v1/completions"),
    ("POST", "/v1/chat/completions"),
    ("POST", "/generate"),
    ("GET", "/v1/models"),
    ("GET", "/v1/models/{model}"),
    ("GET", "/health"),
    ("GET", "/metrics"),
    ("GET", "/stats"),
    ("POST", "/tokenize"),
    ("POST", "/detokenize"),
    ("GET", "/tokenizer_info"),
    ("POST", "/v1/messages"),
    ("POST", "/v1/messages/count_tokens"),
    ("POST", "/v1/responses"),
    ("GET", "/v1/responses/{response_id}"),
    ("DELETE", "/v1/responses/{response_id}"),
    ("GET", "/v1/responses/{response_id}/input_items"),
]
# negative (schema-violating) data exists only for the JSON bodies: a GET's path string
# cannot violate {"type": "string"}
FUZZ_CASES = [(m, p, GenerationMode.POSITIVE) for m, p in OPERATIONS] + [
    (m, p, GenerationMode.NEGATIVE) for m, p in OPERATIONS if m == "POST"
]
HYPOTHESIS = dict(
    max_examples=MAX_EXAMPLES,
    deadline=None,
    database=None,
    derandomize=False,
    suppress_health_check=list(hypothesis.HealthCheck),
    phases=[hypothesis.Phase.explicit, hypothesis.Phase.generate],
)


# -- helpers ----------------------------------------------------------------------------------
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


def schemathesis_cases(
    api_schema, method: str, path: str, mode: GenerationMode, max_examples: int = MAX_EXAMPLES
) -> Counter[int]:
    """Send up to max_examples generated cases: never a 5xx, every 4xx an OpenAI error.
    Returns the count of each status."""
    operation = api_schema[path][method]
    statuses: Counter[int] = Counter()
    slowest: list[Any] = [0.0, None]

    @hypothesis.settings(**{**HYPOTHESIS, "max_examples": max_examples})
    @hypothesis.seed(SEED)
    @hypothesis.given(case=operation.as_strategy(generation_mode=mode))
    def fuzz(case):
        bound_generation(path, case.body)
        if (
            path in MODEL_REQUIRED
            and mode is GenerationMode.POSITIVE
            and isinstance(case.body, dict)
        ):
            case.body["model"] = "smollm2"  # past the 404 for a made-up name, into the engine path
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
    print(
        f"\n{method} {path} {mode.value}: statuses {dict(sorted(statuses.items()))}; "
        f"slowest {slowest[0]:.2f} s: {slowest[1]}"
    )
    return statuses


@pytest.mark.parametrize(
    "method,path,mode", FUZZ_CASES, ids=[f"{m} {p} {mode.value}" for m, p, mode in FUZZ_CASES]
)
def test_schemathesis(server, api_schema, method, path, mode):
    assert schemathesis_cases(api_schema, method, path, mode)


def test_intact_after_schemathesis(server, api_schema, pids_before):
    """A few cases of every operation and mode, then: it still serves, no process
    restarted, every KV block free (whether or not test_schemathesis ran before)."""
    for method, path, mode in FUZZ_CASES:
        assert schemathesis_cases(api_schema, method, path, mode, max_examples=3)
    assert_intact(server, pids_before)


# -- 2. valid bodies, in-range parameters: every one must generate ----------------------------
# schemathesis knows the types only, so most of its bodies are out of range (400); these
# stay inside every documented range, to shake the sampler with odd combinations
# (down to the smallest positive floats: see test_extreme_sampling_params_are_served).


def _floats(lo: float, hi: float, **kw) -> st.SearchStrategy[float]:
    return st.floats(lo, hi, allow_nan=False, allow_infinity=False, **kw)


_text = st.text(st.characters(codec="utf-8"), min_size=1, max_size=24)
_SAMPLING = {
    "temperature": _floats(0, 2),
    "top_p": _floats(0, 1, exclude_min=True),
    "top_k": st.integers(-1, 2 * VOCAB),
    "min_p": _floats(0, 1),
    "repetition_penalty": _floats(0, 10, exclude_min=True),
    "presence_penalty": _floats(-2, 2),
    "frequency_penalty": _floats(-2, 2),
    "seed": st.integers(-(2**63), 2**64 - 1),
    "stop": st.one_of(_text, st.lists(_text, max_size=16)),
    "stop_token_ids": st.lists(st.integers(0, VOCAB - 1), max_size=64),
    "ignore_eos": st.booleans(),
    "skip_special_tokens": st.booleans(),
    "include_stop_str_in_output": st.booleans(),
    "min_tokens": st.integers(0, MAX_GEN_TOKENS),
    "user": st.text(max_size=8),
    "return_timings": st.booleans(),
    "model": st.sampled_from(["smollm2", None]),
    "stream": st.booleans(),
    "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()}),
}
_OPENAI = {**_SAMPLING, "n": st.integers(1, 8)}
_ids = st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=24)
_message = st.fixed_dictionaries(
    {
        "role": st.sampled_from(["system", "user", "assistant"]),
        "content": st.one_of(
            st.none(),
            _text,
            st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": _text}), max_size=3),
        ),
    },
    optional={"name": _text},
)
VALID_BODIES = {
    "/v1/completions": st.fixed_dictionaries(
        {
            "prompt": st.one_of(
                _text,
                _ids,
                st.lists(_text, min_size=1, max_size=1),
                st.lists(_ids, min_size=1, max_size=1),
            ),
            "max_tokens": st.integers(1, MAX_GEN_TOKENS),
        },
        optional={**_OPENAI, "logprobs": st.integers(0, 20), "echo": st.just(False)},
    ),
    "/v1/chat/completions": st.fixed_dictionaries(
        {
            "messages": st.lists(_message, min_size=1, max_size=4),
            "max_tokens": st.integers(1, MAX_GEN_TOKENS),
        },
        optional={
            **_OPENAI,
            "max_completion_tokens": st.integers(1, MAX_GEN_TOKENS),
            "logprobs": st.booleans(),
            "top_logprobs": st.integers(0, 20),
        },
    ),
    "/generate": st.fixed_dictionaries(
        {"prompt": _text, "max_new_tokens": st.integers(1, MAX_GEN_TOKENS)}, optional=_SAMPLING
    ),
}


def _length(path: str, body: dict[str, Any]) -> int:
    if path == "/generate":
        return body["max_new_tokens"]
    return body.get("max_completion_tokens") or body["max_tokens"]  # the newer name wins


def _fix_up(path: str, body: dict[str, Any]) -> dict[str, Any]:
    """The cross-field rules: top_logprobs needs logprobs; min_tokens <= the length;
    stream_options need stream."""
    if "top_logprobs" in body:
        body["logprobs"] = True
    if "min_tokens" in body:
        body["min_tokens"] = min(body["min_tokens"], _length(path, body))
    if not body.get("stream", path == "/generate"):
        body.pop("stream_options", None)  # only with stream (a 400 otherwise)
    return body


def _sse_payloads(text: str) -> list[Any]:
    events = [e for e in text.split("\n\n") if e.strip()]
    assert events and events[-1] == "data: [DONE]", text[-300:]
    return [json.loads(e.removeprefix("data: ")) for e in events[:-1]]


def valid_bodies(server, path: str, max_examples: int = MAX_EXAMPLES) -> None:
    """Send up to max_examples valid bodies. Each: 200; n choices, each finished; at most
    n * max_tokens tokens (exactly that with ignore_eos and nothing that stops early); a
    stream ends with [DONE], no error event."""
    client = httpx.Client(timeout=60)
    statuses: Counter[str] = Counter()

    @hypothesis.settings(**{**HYPOTHESIS, "max_examples": max_examples})
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
            finals = [
                c["choices"][0]["finish_reason"]
                for c in chunks
                if c["choices"] and c["choices"][0]["finish_reason"]
            ]
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


@pytest.mark.parametrize("path", list(VALID_BODIES))
def test_valid_bodies_generate(server, path):
    valid_bodies(server, path)


def test_intact_after_valid_bodies(server, pids_before):
    """A few valid bodies on each path, then: it still serves, no process restarted,
    every KV block free (whether or not test_valid_bodies_generate ran before)."""
    for path in VALID_BODIES:
        valid_bodies(server, path, max_examples=2)
    assert_intact(server, pids_before)
