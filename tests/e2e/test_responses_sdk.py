"""/v1/responses end to end: the real server (launch.py, the default model) with the official
openai client's Responses API: create, stream, a function-call round trip over
previous_response_id, a json_schema text format, retrieve, input items and delete."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest

pytestmark = pytest.mark.timeout(180)

ADD_SCHEMA = {
    "type": "object",
    "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
    "required": ["a", "b"],
    "additionalProperties": False,
}
ADD = {
    "type": "function",
    "name": "add",
    "description": "Add two integers",
    "parameters": ADD_SCHEMA,
    "strict": True,
}
COLOR_SCHEMA = {
    "type": "object",
    "properties": {
        "color": {"type": "string", "enum": ["red", "green", "blue"]},
        "bright": {"type": "boolean"},
    },
    "required": ["color", "bright"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def client(server):
    with openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0) as c:
        yield c


def test_create_text(client):
    resp = client.responses.create(
        model="smollm2",
        instructions="You are a helpful assistant.",
        input="What is the capital of France?",
        max_output_tokens=24,
        temperature=0,
    )
    assert resp.object == "response" and resp.id.startswith("resp_")
    assert resp.status in ("completed", "incomplete")
    assert resp.output_text.strip()  # the SDK joins the output_text parts
    assert resp.usage.input_tokens > 0 and 0 < resp.usage.output_tokens <= 24
    assert resp.usage.total_tokens == resp.usage.input_tokens + resp.usage.output_tokens
    again = client.responses.retrieve(resp.id)
    assert again.output_text == resp.output_text
    (item,) = client.responses.input_items.list(resp.id)  # the SDK's pager
    assert item.type == "message" and item.role == "user"
    assert item.content[0].text == "What is the capital of France?"
    deleted = client.responses.delete(resp.id)
    assert deleted is None or getattr(deleted, "deleted", True)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(resp.id)


def test_stream_events_and_final_response(client):
    with client.responses.stream(
        model="smollm2",
        input="What is the capital of France? Answer in one word.",
        max_output_tokens=64,
        temperature=0,
    ) as stream:
        events = list(stream)
        final = stream.get_final_response()
    types = [e.type for e in events]
    assert types[:2] == ["response.created", "response.in_progress"]
    assert types[-1] == "response.completed"
    assert "response.output_item.done" in types and "response.output_text.done" in types
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas and deltas == final.output_text
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert final.usage.output_tokens > 0


def test_function_call_round_trip(client):
    first = client.responses.create(
        model="smollm2",
        input="What is 2 plus 3?",
        tools=[ADD],
        tool_choice={"type": "function", "name": "add"},
        max_output_tokens=60,
        temperature=0,
    )
    calls = [item for item in first.output if item.type == "function_call"]
    assert calls, first.output
    call = calls[0]
    assert call.name == "add" and call.call_id
    args = json.loads(call.arguments)
    jsonschema.validate(args, ADD_SCHEMA)
    second = client.responses.create(
        model="smollm2",
        previous_response_id=first.id,
        input=[
            {
                "type": "function_call_output",
                "call_id": call.call_id,
                "output": str(args["a"] + args["b"]),
            }
        ],
        tools=[ADD],
        tool_choice="none",
        max_output_tokens=24,
        temperature=0,
    )
    assert second.previous_response_id == first.id
    assert second.output_text.strip()
    # the round trip's prompt holds the first turn, its call and the call's output
    assert second.usage.input_tokens > first.usage.input_tokens
    listed = list(client.responses.input_items.list(second.id, order="asc", limit=1))
    assert [i.type for i in listed] == ["message", "function_call", "function_call_output"]
    assert listed[1].call_id == call.call_id  # paged one by one by the SDK (after=)


def test_json_schema_output_parses(client):
    resp = client.responses.create(
        model="smollm2",
        input="Pick a color for the sky and say whether it is bright.",
        text={
            "format": {
                "type": "json_schema",
                "name": "Color",
                "schema": COLOR_SCHEMA,
                "strict": True,
            }
        },
        max_output_tokens=100,
        temperature=0,
    )
    assert resp.status == "completed", resp
    jsonschema.validate(json.loads(resp.output_text), COLOR_SCHEMA)


def test_errors_in_openai_shape(client):
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="smollm2", input="x", previous_response_id="resp_nope")
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model="smollm2", input="x", tools=[{"type": "web_search"}])
    assert e.value.body["param"] == "tools.0.type"
