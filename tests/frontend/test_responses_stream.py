"""/v1/responses' output: the event stream (its sequence, an error mid-stream, tool calls
streamed) and the response object of a tool call (fake backend, see fake_backend.py)."""

from __future__ import annotations

import json

import pytest

from frontend.api.responses_output import EventStream, response_object
from tests.frontend.fake_backend import NUM_PROMPT_TOKENS

pytestmark = pytest.mark.timeout(30)


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
