"""Structured outputs and forced tool calls with speculative decoding, through the real
processes and the OpenAI SDK: a server with ngram drafts answers a json_schema
response_format and a tool_choice that forces a call with the same greedy output whether
the request drafts or not ("speculative": false), valid against the schema, and the drafts
were accepted (usage.timings)."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest

from benchmarks.bench_spec_json import ASKS, ORDER_SCHEMA
from tests.e2e.test_tool_calls import ADD, CALLED_BEFORE, WEATHER, WEATHER_SCHEMA

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def client(ngram_server):
    return openai.OpenAI(base_url=ngram_server.url + "/v1", api_key="x", max_retries=0, timeout=240)


def _ask(client: openai.OpenAI, spec: bool, stream: bool = False, **kw):
    """(the message's content, its tool calls as (name, arguments), finish reason, timings)."""
    extra = {"speculative": spec, "return_timings": True}
    kw = dict(model="smollm2", temperature=0, extra_body=extra, **kw)
    if stream:
        with client.chat.completions.stream(**kw) as s:  # type: ignore[arg-type]
            for _ in s:
                pass
            r = s.get_final_completion()
    else:
        r = client.chat.completions.create(**kw)
    choice = r.choices[0]
    calls = [(c.function.name, c.function.arguments) for c in choice.message.tool_calls or []]
    timings = ((r.usage.model_extra or {}).get("timings") or {}) if r.usage else {}
    return choice.message.content, calls, choice.finish_reason, timings


def test_json_schema_same_with_and_without_drafts(client):
    fmt = {"type": "json_schema", "json_schema": {"name": "order", "schema": ORDER_SCHEMA}}
    kw = dict(
        messages=[{"role": "user", "content": ASKS["json"]}],
        response_format=fmt,
        max_tokens=160,
    )
    plain, _, reason, plain_timings = _ask(client, False, **kw)
    drafted, _, drafted_reason, timings = _ask(client, True, **kw)
    assert drafted == plain and (drafted_reason, reason) == ("stop", "stop")
    jsonschema.validate(json.loads(drafted), ORDER_SCHEMA)
    assert "num_draft_tokens" not in plain_timings
    assert timings["num_accepted_tokens"] > 10  # the record was drafted from the prompt
    assert timings["num_draft_tokens"] > timings["num_accepted_tokens"]
    assert _ask(client, True, stream=True, **kw)[0] == plain


@pytest.mark.parametrize(
    "tool_choice",
    ["required", {"type": "function", "function": {"name": "get_weather"}}],
    ids=["required", "named"],
)
def test_forced_tool_call_same_with_and_without_drafts(client, tool_choice):
    """An earlier turn holds a call of the same tool: the new call is drafted from it."""
    kw = dict(
        messages=CALLED_BEFORE,
        tools=[WEATHER, ADD],
        tool_choice=tool_choice,
        parallel_tool_calls=False,
        max_tokens=80,
    )
    _, plain, reason, _ = _ask(client, False, **kw)
    _, drafted, drafted_reason, timings = _ask(client, True, **kw)
    assert drafted == plain and (drafted_reason, reason) == ("tool_calls", "tool_calls")
    ((name, args),) = drafted
    assert name == "get_weather"
    jsonschema.validate(json.loads(args), WEATHER_SCHEMA)
    assert timings["num_accepted_tokens"] > 5
    assert _ask(client, True, stream=True, **kw)[1] == plain
