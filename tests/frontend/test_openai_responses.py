"""/v1/responses over the chat path (frontend/api/): the translation of input items, tools
and text.format into the chat request the tokenizer pool gets, the response object and
the event stream, the store's bounds, previous_response_id, GET and DELETE, and errors in
OpenAI's shape (fake backend: every answer is "Hello", " world", "!", see fake_backend.py)."""

from __future__ import annotations

import json

import pytest

from frontend.api.response_store import ResponseStore
from frontend.api.responses_output import EventStream, response_object
from frontend.api.responses_protocol import rename
from frontend.errors import APIError
from tests.frontend.conftest import serve
from tests.frontend.fake_backend import NUM_PROMPT_TOKENS

pytestmark = pytest.mark.timeout(30)


def _last_request(served):
    with served.backend.lock:
        return served.backend.requests[-1]


def _events(body: str) -> list[dict]:
    """The stream's events, checking that each `event:` line names its data's type."""
    out = []
    assert body.endswith("\n\n")
    for block in body[:-2].split("\n\n"):
        event_line, data_line = block.split("\n")
        assert event_line.startswith("event: ") and data_line.startswith("data: ")
        data = json.loads(data_line[len("data: ") :])
        assert data["type"] == event_line[len("event: ") :]
        out.append(data)
    return out


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
    req = _last_request(served)
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
    req = _last_request(served)
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
    structured = _last_request(served).params.structured
    assert structured is not None and "json" in json.dumps(structured)
    r = http.post("/v1/responses", json={"input": "x", "text": {"format": {"type": "json_object"}}})
    assert r.status_code == 200 and _last_request(served).params.structured is not None
    r = http.post("/v1/responses", json={"input": "x", "text": {"format": {"type": "text"}}})
    assert r.status_code == 200 and _last_request(served).params.structured is None


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


def test_previous_response_id_prepends_the_conversation(served, http):
    first = http.post("/v1/responses", json={"input": "Hi", "instructions": "Only here."}).json()
    second = http.post(
        "/v1/responses", json={"input": "More", "previous_response_id": first["id"]}
    ).json()
    assert second["previous_response_id"] == first["id"]
    assert _last_request(served).messages == [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello world!"},
        {"role": "user", "content": "More"},
    ]
    http.post("/v1/responses", json={"input": "Again", "previous_response_id": second["id"]})
    assert [m["content"] for m in _last_request(served).messages] == [
        "Hi",
        "Hello world!",
        "More",
        "Hello world!",
        "Again",
    ]


def test_retrieve_delete_and_store_false(http):
    body = http.post("/v1/responses", json={"input": "Hi"}).json()
    assert http.get(f"/v1/responses/{body['id']}").json() == body
    r = http.delete(f"/v1/responses/{body['id']}")
    assert r.json() == {"id": body["id"], "object": "response.deleted", "deleted": True}
    assert http.get(f"/v1/responses/{body['id']}").status_code == 404
    assert http.delete(f"/v1/responses/{body['id']}").status_code == 404
    unkept = http.post("/v1/responses", json={"input": "Hi", "store": False}).json()
    assert unkept["store"] is False
    r = http.get(f"/v1/responses/{unkept['id']}")
    assert r.status_code == 404 and r.json()["error"]["message"]
    r = http.post("/v1/responses", json={"input": "x", "previous_response_id": unkept["id"]})
    assert r.status_code == 404


def test_stream_event_sequence(http):
    r = http.post("/v1/responses", json={"input": "Hi", "stream": True})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = _events(r.text)
    assert [e["type"] for e in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert events[0]["response"]["status"] == "in_progress"
    item_id = events[2]["item"]["id"]
    deltas = [e for e in events if e["type"] == "response.output_text.delta"]
    assert [d["delta"] for d in deltas] == ["Hello", " world", "!"]
    assert all(
        d["item_id"] == item_id and d["output_index"] == 0 and d["content_index"] == 0
        for d in deltas
    )
    assert events[7]["text"] == "Hello world!"
    final = events[-1]["response"]
    assert final["status"] == "completed" and final["output"][0]["id"] == item_id
    assert final["output"][0]["content"][0]["text"] == "Hello world!"
    assert (
        final["usage"]["output_tokens"] == 3 and final["usage"]["input_tokens"] == NUM_PROMPT_TOKENS
    )
    assert http.get(f"/v1/responses/{final['id']}").json() == final  # stored at the end


def test_stream_error_mid_stream_is_an_error_event(http):
    r = http.post("/v1/responses", json={"input": "fail-late", "stream": True})
    events = _events(r.text)
    assert events[-1]["type"] == "error" and events[-1]["message"] == "engine exploded"
    assert not any(e["type"] == "response.completed" for e in events)
    assert http.get(f"/v1/responses/{events[0]['response']['id']}").status_code == 404


def test_stream_of_tool_calls():
    """Chat's streamed tool-call deltas become function_call items with argument deltas."""
    stream = EventStream({"id": "resp_1"})
    events = stream.start()
    chunks = [
        {"choices": [{"delta": {"role": "assistant", "content": ""}, "finish_reason": None}]},
        {"choices": [{"delta": {"content": "Let me see."}, "finish_reason": None}]},
        {
            "choices": [
                {
                    "delta": {
                        "tool_calls": [
                            {
                                "index": 0,
                                "id": "call_a",
                                "type": "function",
                                "function": {"name": "f", "arguments": ""},
                            }
                        ]
                    }
                }
            ]
        },
        {
            "choices": [
                {"delta": {"tool_calls": [{"index": 0, "function": {"arguments": '{"x":'}}]}}
            ]
        },
        {"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {"arguments": " 1}"}}]}}]},
        {
            "choices": [
                {
                    "delta": {
                        "tool_calls": [
                            {
                                "index": 1,
                                "id": "call_b",
                                "type": "function",
                                "function": {"name": "g", "arguments": "{}"},
                            }
                        ]
                    }
                }
            ]
        },
        {"choices": [{"delta": {}, "finish_reason": "tool_calls"}]},
        {
            "choices": [],
            "usage": {
                "prompt_tokens": 9,
                "completion_tokens": 4,
                "prompt_tokens_details": {"cached_tokens": 8},
            },
        },
    ]
    for chunk in chunks:
        events += stream.feed(chunk)
    events += stream.done()
    types = [e["type"] for e in events]
    assert types == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert events[8]["item"]["status"] == "in_progress" and events[8]["output_index"] == 1
    assert events[11]["arguments"] == '{"x": 1}' and events[11]["output_index"] == 1
    msg, call_a, call_b = stream.response["output"]
    assert msg["content"][0]["text"] == "Let me see."
    assert (call_a["call_id"], call_a["name"], call_a["arguments"]) == ("call_a", "f", '{"x": 1}')
    assert call_a["id"].startswith("fc_") and call_a["status"] == "completed"
    assert (call_b["call_id"], call_b["arguments"]) == ("call_b", "{}")
    assert stream.response["usage"]["input_tokens_details"] == {"cached_tokens": 8}
    assert stream.response["usage"]["total_tokens"] == 13


def test_response_object_of_a_tool_call():
    chat = {
        "choices": [
            {
                "message": {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [
                        {
                            "id": "call_z",
                            "type": "function",
                            "function": {"name": "f", "arguments": "{}"},
                        }
                    ],
                },
                "finish_reason": "tool_calls",
            }
        ],
        "usage": {"prompt_tokens": 4, "completion_tokens": 2, "total_tokens": 6},
    }
    out = response_object({"id": "resp_x"}, chat)
    (item,) = out["output"]  # no empty message beside the call
    assert item["type"] == "function_call" and item["call_id"] == "call_z" and item["name"] == "f"
    assert out["status"] == "completed" and out["usage"]["input_tokens_details"] == {
        "cached_tokens": 0
    }


def test_store_bounds_count_and_bytes_oldest_first():
    def response(i: int, size: int = 10) -> dict:
        return {"id": f"resp_{i}", "output": ["x" * size]}

    store = ResponseStore(max_count=3, max_bytes=10_000)
    for i in range(5):
        assert store.put(response(i), [])
        store.check_integrity()
    assert len(store) == 3 and "resp_0" not in store and "resp_1" not in store and "resp_4" in store
    store = ResponseStore(max_count=100, max_bytes=1_000)
    for i in range(5):
        store.put(response(i, 300), [{"type": "message", "role": "user", "content": "hi"}])
        store.check_integrity()
    assert [i for i in range(5) if f"resp_{i}" in store] == [3, 4]  # 2 × ~350 bytes fit
    assert not store.put(response(9, 2_000), [])  # bigger than the whole store: not kept
    assert "resp_9" not in store and len(store) == 2
    store.check_integrity()
    assert store.delete("resp_3") and not store.delete("resp_3")
    store.check_integrity()


def test_store_bound_applies_to_the_server():
    with serve(responses_store_max=2) as s, s.client() as http:
        ids = [http.post("/v1/responses", json={"input": "Hi"}).json()["id"] for _ in range(3)]
        assert [http.get(f"/v1/responses/{i}").status_code for i in ids] == [404, 200, 200]
