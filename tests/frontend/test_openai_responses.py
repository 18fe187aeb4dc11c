"""/v1/responses over the chat path (frontend/api/): the translation of input items, tools
and text.format into the chat request the tokenizer pool gets, the response object, and
errors in OpenAI's shape (fake backend: every answer is "Hello", " world", "!", see
fake_backend.py). The event stream: test_responses_stream.py; the store:
test_responses_store.py."""

from __future__ import annotations

import json

import pytest

from frontend.api.responses_protocol import rename
from frontend.errors import APIError
from tests.frontend.conftest import last_request
from tests.frontend.fake_backend import NUM_PROMPT_TOKENS

pytestmark = pytest.mark.timeout(30)


def test_text_input_and_instructions(served, http):
    r = http.post(
        "/v1/responses",
        json={"model": served.config.model_name, "input": "Hi", "instructions": "Be brief."},
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "response" and body["id"].startswith("resp_")
    assert body["status"] == "completed" and body["incomplete_details"] is None
    (item,) = body["output"]
    assert item["type"] == "message" and item["id"].startswith("msg_")
    assert item["role"] == "assistant" and item["status"] == "completed"
    assert item["content"] == [{"type": "output_text", "text": "Hello world!", "annotations": []}]
    assert "output_text" not in body  # the SDK computes it
    assert body["usage"] == {
        "input_tokens": NUM_PROMPT_TOKENS,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": 3,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": NUM_PROMPT_TOKENS + 3,
    }
    assert body["instructions"] == "Be brief." and body["store"] is True
    assert body["tool_choice"] == "auto" and body["tools"] == []
    req = last_request(served)
    assert req.kind == "chat"
    assert req.messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
    ]


def test_items_tools_and_sampling_reach_the_tokenizer(served, http):
    tool = {
        "type": "function",
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    }
    items = [
        {"role": "developer", "content": "Use tools."},
        {
            "role": "user",
            "content": [
                {"type": "input_text", "text": "Weather in "},
                {"type": "input_text", "text": "Paris?"},
            ],
        },
        {
            "type": "function_call",
            "call_id": "call_1",
            "name": "get_weather",
            "arguments": '{"city": "Paris"}',
        },
        {"type": "function_call_output", "call_id": "call_1", "output": "18C"},
    ]
    r = http.post(
        "/v1/responses",
        json={
            "input": items,
            "tools": [tool],
            "tool_choice": "auto",
            "max_output_tokens": 7,
            "temperature": 0.5,
            "top_p": 0.9,
            "metadata": {"k": "v"},
            "user": "u1",
        },
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["tools"] == [tool] and body["metadata"] == {"k": "v"}
    assert body["temperature"] == 0.5 and body["top_p"] == 0.9 and body["max_output_tokens"] == 7
    req = last_request(served)
    assert req.messages[:2] == [
        {"role": "developer", "content": "Use tools."},
        {"role": "user", "content": "Weather in Paris?"},
    ]
    (call,) = req.messages[2]["tool_calls"]
    assert req.messages[2]["role"] == "assistant"
    assert call["id"] == "call_1" and call["function"] == {
        "name": "get_weather",
        "arguments": {"city": "Paris"},
    }
    assert req.messages[3]["role"] == "tool" and req.messages[3]["tool_call_id"] == "call_1"
    assert req.messages[3]["content"] == "18C"
    assert [t["function"]["name"] for t in req.tools] == ["get_weather"]
    assert req.params.max_tokens == 7 and req.params.temperature == 0.5
    assert req.params.top_p == 0.9


def test_json_schema_format_becomes_structured_output(served, http):
    schema = {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}
    fmt = {"type": "json_schema", "name": "A", "schema": schema, "strict": True}
    r = http.post("/v1/responses", json={"input": "x", "text": {"format": fmt}})
    assert r.status_code == 200, r.text
    assert r.json()["text"] == {"format": fmt}
    structured = last_request(served).params.structured
    assert structured is not None and "json" in json.dumps(structured)
    r = http.post("/v1/responses", json={"input": "x", "text": {"format": {"type": "json_object"}}})
    assert r.status_code == 200 and last_request(served).params.structured is not None
    r = http.post("/v1/responses", json={"input": "x", "text": {"format": {"type": "text"}}})
    assert r.status_code == 200 and last_request(served).params.structured is None


def test_max_output_tokens_makes_it_incomplete(http):
    body = http.post("/v1/responses", json={"input": "x", "max_output_tokens": 2}).json()
    assert body["status"] == "incomplete"
    assert body["incomplete_details"] == {"reason": "max_output_tokens"}
    assert body["output"][0]["content"][0]["text"] == "Hello world"


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
            "input.0.content.0",
        ),
        ({"input": [{"type": "reasoning", "summary": []}]}, "input.0.type"),
        ({"input": []}, "input"),
        ({"input": 5}, "input"),
        ({"tools": [{"type": "web_search"}]}, "tools.0.type"),
        ({"tools": [{"type": "function", "name": "f", "function": {}}]}, "tools.0.function"),
        ({"tools": [{"type": "function", "name": "a b"}]}, "tools.0.name"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tool_choice": {"type": "function", "function": {"name": "f"}}}, "tool_choice"),
        ({"text": {"format": {"type": "json_schema", "name": "A"}}}, "text.format"),
        ({"text": {"format": {"type": "regex"}}}, "text.format.type"),
        ({"max_output_tokens": 0}, "max_output_tokens"),
        ({"temperature": "hot"}, "temperature"),
        ({"background": True}, "background"),
        ({"frobnicate": 1}, "frobnicate"),
    ],
)
def test_bad_fields_are_400s_naming_them(http, extra, param):
    r = http.post("/v1/responses", json={"input": "x", **extra})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == param, err


def test_rename_names_the_responses_fields():
    e = rename(APIError(400, "max_completion_tokens: must be >= 1", param="max_completion_tokens"))
    assert (e.param, e.message) == ("max_output_tokens", "max_output_tokens: must be >= 1")
    assert (
        rename(APIError(400, "x", param="tools.3.function.parameters")).param
        == "tools.3.parameters"
    )
    assert rename(APIError(400, "x", param="messages.2.content")).param == "input"
    assert rename(APIError(400, "x", param="temperature")).param == "temperature"


def test_unknown_model_and_previous_id_are_404s(http):
    r = http.post("/v1/responses", json={"input": "x", "model": "nope"})
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    r = http.post("/v1/responses", json={"input": "x", "previous_response_id": "resp_nope"})
    assert r.status_code == 404, r.text
    err = r.json()["error"]
    assert err["param"] == "previous_response_id" and "resp_nope" in err["message"]
    assert set(err) == {"message", "type", "param", "code"}
