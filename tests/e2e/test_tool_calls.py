"""Tool calling end to end: the real server (launch.py, the default SmolLM2 model) with the
official openai client and LangChain.

What the 135M model does at temperature 0 (observed, and what these tests rely on): asked
about the weather with a weather tool and nothing else, it answers in prose (it never
calls); after one earlier turn in which it called the tool, it calls it again for the new
question, in the Hermes format of the tool prompt. `required` and named tool_choice are
forced by a grammar (constrained decoding), so those tests skip on a build without it.
"""

from __future__ import annotations

import json
from dataclasses import fields

import httpx
import jsonschema
import openai
import pytest

from common.sampling_params import SamplingParams

pytestmark = pytest.mark.timeout(300)

HAS_STRUCTURED = any(f.name == "structured" for f in fields(SamplingParams))
needs_structured = pytest.mark.skipif(
    not HAS_STRUCTURED,
    reason="SamplingParams has no `structured` field: this build has no constrained decoding",
)

WEATHER_SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string", "description": "The city name"}},
    "required": ["city"],
}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a given city",
        "parameters": WEATHER_SCHEMA,
    },
}
ADD_SCHEMA = {
    "type": "object",
    "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
    "required": ["a", "b"],
    "additionalProperties": False,
}
ADD = {
    "type": "function",
    "function": {"name": "add", "description": "Add two integers", "parameters": ADD_SCHEMA},
}
# one earlier turn with a call: the model then calls for the new question too
CALLED_BEFORE = [
    {"role": "user", "content": "What is the weather in Rome?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_0",
                "type": "function",
                "function": {"name": "get_weather", "arguments": json.dumps({"city": "Rome"})},
            }
        ],
    },
    {"role": "user", "content": "What is the weather in Paris?"},
]


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def _create(client: openai.OpenAI, messages: list, **kwargs):
    kwargs = {"temperature": 0, "max_tokens": 60, **kwargs}
    return client.chat.completions.create(model="smollm2", messages=messages, **kwargs)


def test_auto_calls_the_tool(client):
    r = _create(client, CALLED_BEFORE, tools=[WEATHER, ADD])
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    assert choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name == "get_weather"
    args = json.loads(call.function.arguments)
    jsonschema.validate(args, WEATHER_SCHEMA)
    assert args == {"city": "Paris"}


def test_without_the_earlier_call_the_model_answers_in_prose(client):
    """What the brief asked to report: this model does not call on a bare question."""
    r = _create(client, CALLED_BEFORE[-1:], tools=[WEATHER])
    assert r.choices[0].message.tool_calls is None
    assert r.choices[0].finish_reason in ("stop", "length")
    assert r.choices[0].message.content


def test_streamed_call_assembled_by_the_client(client):
    """delta.tool_calls: id, type and name first, then argument fragments; the openai
    client's stream helper assembles the same call as the whole response."""
    whole = _create(client, CALLED_BEFORE, tools=[WEATHER, ADD]).choices[0].message.tool_calls[0]
    chunks = list(_create(client, CALLED_BEFORE, tools=[WEATHER, ADD], stream=True))
    deltas = [c.choices[0].delta.tool_calls for c in chunks if c.choices]
    deltas = [d for ds in deltas if ds for d in ds]
    first = deltas[0]
    assert first.index == 0 and first.id.startswith("call_") and first.type == "function"
    assert first.function.name == "get_weather"
    assert all(d.id is None and d.function.name is None for d in deltas[1:])
    assert len(deltas) > 2  # the arguments came in fragments
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    with client.chat.completions.stream(
        model="smollm2", messages=CALLED_BEFORE, tools=[WEATHER, ADD], temperature=0, max_tokens=60
    ) as stream:
        events = [e.type for e in stream]
        final = stream.get_final_completion()
    assert "tool_calls.function.arguments.done" in events
    (call,) = final.choices[0].message.tool_calls
    assert (call.function.name, call.function.arguments) == (
        whole.function.name,
        whole.function.arguments,
    )
    assert final.choices[0].finish_reason == "tool_calls"


def test_tool_result_sent_back_and_answered(client, server):
    """The call and its result go back in the history (role "tool"); the model answers
    with text, and the prompt holds the result."""
    first = _create(client, CALLED_BEFORE, tools=[WEATHER])
    message = first.choices[0].message
    call = message.tool_calls[0]
    result = json.dumps({"temperature_c": 18, "sky": "cloudy"})
    history = [
        *CALLED_BEFORE,
        message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": result},
    ]
    r = _create(client, history, tools=[WEATHER])
    choice = r.choices[0]
    assert choice.finish_reason == "stop" and choice.message.tool_calls is None
    assert choice.message.content
    counted = httpx.post(server.url + "/tokenize", json={"prompt": result}, timeout=30).json()
    grown = r.usage.prompt_tokens - first.usage.prompt_tokens
    # the call written back, the result and the turns' framing
    assert grown >= first.usage.completion_tokens + counted["count"]


def test_tool_choice_none_is_never_parsed(client):
    r = _create(client, CALLED_BEFORE, tools=[WEATHER], tool_choice="none")
    assert r.choices[0].message.tool_calls is None
    assert r.choices[0].finish_reason != "tool_calls"


@needs_structured
@pytest.mark.parametrize("stream", [False, True])
def test_required_forces_a_valid_call(client, stream):
    """A bare question, on which the model would answer in prose: `required` makes it
    call, with arguments valid against the schema."""
    messages = [{"role": "user", "content": "What is 2 plus 3?"}]
    if stream:
        with client.chat.completions.stream(
            model="smollm2",
            messages=messages,
            tools=[WEATHER, ADD],
            tool_choice="required",
            temperature=0,
            max_tokens=80,
        ) as s:
            for _ in s:
                pass
            choice = s.get_final_completion().choices[0]
    else:
        choice = _create(
            client, messages, tools=[WEATHER, ADD], tool_choice="required", max_tokens=80
        ).choices[0]
    assert choice.finish_reason == "tool_calls", choice
    assert choice.message.tool_calls
    schemas = {"get_weather": WEATHER_SCHEMA, "add": ADD_SCHEMA}
    for call in choice.message.tool_calls:
        jsonschema.validate(json.loads(call.function.arguments), schemas[call.function.name])


@needs_structured
def test_required_call_has_only_the_schema_properties(client):
    """WEATHER_SCHEMA says nothing of additionalProperties: its arguments are closed all
    the same, and written without free whitespace. Open, at temperature 0 the model wrote
    `{\n  "city": "Paris",\n  "temperature": 25.8,\n  "temperature_celsius": ...` until
    max_tokens, and no call came back."""
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    r = _create(client, messages, tools=[WEATHER], tool_choice="required", max_tokens=200)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    for call in choice.message.tool_calls:
        args = json.loads(call.function.arguments)
        assert set(args) <= set(WEATHER_SCHEMA["properties"]), args
        jsonschema.validate(args, WEATHER_SCHEMA)


@needs_structured
def test_named_tool_choice_calls_that_function(client):
    r = _create(
        client,
        [{"role": "user", "content": "What is the weather in Paris?"}],
        tools=[WEATHER, ADD],
        tool_choice={"type": "function", "function": {"name": "add"}},
        parallel_tool_calls=False,
        max_tokens=80,
    )
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    (call,) = choice.message.tool_calls
    assert call.function.name == "add"
    jsonschema.validate(json.loads(call.function.arguments), ADD_SCHEMA)


@pytest.mark.parametrize(
    "kwargs, param",
    [
        (
            {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
            "tool_choice.function.name",
        ),
        (
            {"tools": [{"type": "function", "function": {"name": "bad name"}}]},
            "tools.0.function.name",
        ),
        (
            {
                "tools": [
                    {"type": "function", "function": {"name": "f", "parameters": {"type": "nope"}}}
                ]
            },
            "tools.0.function.parameters",
        ),
        ({"tools": [{"type": "code_interpreter"}]}, "tools.0.type"),
        ({"tool_choice": "required"}, "tool_choice"),
    ],
)
def test_bad_tools_are_400s(client, kwargs, param):
    with pytest.raises(openai.BadRequestError) as e:
        _create(client, CALLED_BEFORE, **kwargs)
    assert e.value.body["param"] == param, e.value.body


def _langchain(server):
    lc = pytest.importorskip("langchain_openai")
    return lc.ChatOpenAI(
        base_url=server.url + "/v1", api_key="unused", model="smollm2", temperature=0, max_tokens=60
    )


def _lc_history():
    from langchain_core.messages import AIMessage, HumanMessage

    return [
        HumanMessage("What is the weather in Rome?"),
        AIMessage(
            "", tool_calls=[{"name": "get_weather", "args": {"city": "Rome"}, "id": "call_0"}]
        ),
        HumanMessage("What is the weather in Paris?"),
    ]


def get_weather(city: str) -> str:
    """Get the current weather in a given city."""
    return "18C"


def test_langchain_bind_tools(server):
    llm = _langchain(server).bind_tools([get_weather])
    out = llm.invoke(_lc_history())
    assert out.tool_calls and out.tool_calls[0]["name"] == "get_weather"
    assert out.tool_calls[0]["args"] == {"city": "Paris"}
    assert out.response_metadata["finish_reason"] == "tool_calls"
    # and streamed: LangChain assembles the chunks' tool_call_chunks
    chunks = list(llm.stream(_lc_history()))
    total = chunks[0]
    for c in chunks[1:]:
        total = total + c
    assert total.tool_calls == [{**out.tool_calls[0], "id": total.tool_calls[0]["id"]}]


@needs_structured
@pytest.mark.parametrize("method", ["function_calling", "json_schema"])
def test_langchain_with_structured_output(server, method):
    from pydantic import BaseModel

    class Weather(BaseModel):
        city: str
        temperature_c: int

    llm = _langchain(server).with_structured_output(Weather, method=method)
    out = llm.invoke("Make up the weather in Paris.")
    assert isinstance(out, Weather)
