"""The tool fields of a chat request at intake (frontend.tools.request): malformed tools, unknown
names in tool_choice and bad tool traces in the history are 400s naming the field; good
ones reach the tokenizer pool with the checked tools."""

from __future__ import annotations

import httpx
import pytest

pytestmark = pytest.mark.timeout(30)

CHAT = [{"role": "user", "content": "Hi"}]
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


def _error(r: httpx.Response) -> dict:
    assert r.status_code == 400, r.text
    return r.json()["error"]


@pytest.mark.parametrize(
    "extra, param",
    [
        ({"tools": [{"type": "retrieval"}]}, "tools.0.type"),
        ({"tools": [{"type": "function"}]}, "tools.0.function"),
        ({"tools": [{"type": "function", "function": {"name": "a b"}}]}, "tools.0.function.name"),
        ({"tools": [WEATHER, WEATHER]}, "tools.1.function.name"),
        (
            {"tools": [{"type": "function", "function": {"name": "f", "parameters": []}}]},
            "tools.0.function.parameters",
        ),
        (
            {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": 5}}}]},
            "tools.0.function.parameters",
        ),
        (
            {
                "tools": [
                    {"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}
                ]
            },
            "tools.0.function.parameters",
        ),
        ({"tools": [WEATHER], "tool_choice": "sometimes"}, "tool_choice"),
        ({"tool_choice": "required"}, "tool_choice"),
        (
            {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
            "tool_choice.function.name",
        ),
        ({"tools": [WEATHER], "tool_choice": {"type": "function"}}, "tool_choice"),
        (
            {
                "messages": [
                    *CHAT,
                    {"role": "assistant", "content": None, "tool_calls": [{"id": "1"}]},
                ]
            },
            "messages.1.tool_calls.0",
        ),
        (
            {
                "messages": [
                    *CHAT,
                    {
                        "role": "assistant",
                        "tool_calls": [
                            {
                                "id": "1",
                                "type": "function",
                                "function": {"name": "f", "arguments": {}},
                            }
                        ],
                    },
                ]
            },
            "messages.1.tool_calls.0.function.arguments",
        ),
        ({"messages": [*CHAT, {"role": "tool", "content": "18C"}]}, "messages.1.tool_call_id"),
        (
            {"messages": [{"role": "user", "content": "x", "tool_calls": []}, *CHAT]},
            None,  # an empty list is no tool call: accepted
        ),
    ],
)
def test_bad_tool_fields_are_400s_naming_them(http, extra, param):
    r = http.post("/v1/chat/completions", json={"messages": CHAT, **extra})
    if param is None:
        assert r.status_code == 200, r.text
        return
    err = _error(r)
    assert err["param"] == param, err
    assert param.split(".")[0] in err["message"], err


def test_tools_and_history_reach_the_tokenizer(http, served):
    """A good request with tools and a tool round trip in the history is served, and the
    tokenizer gets the tools normalised and the history in the template's shape."""
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
    }
    messages = [
        *CHAT,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18C"},
    ]
    r = http.post(
        "/v1/chat/completions",
        json={"messages": messages, "tools": [WEATHER], "tool_choice": "auto"},
    )
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] == "Hello world!"  # no call in it
    req = served.backend.requests[-1]
    assert req.tools == [WEATHER]
    assert req.messages[1] == {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "type": "function",
                "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
                "id": "call_1",
            }
        ],
    }
    assert req.messages[2] == {
        "role": "tool",
        "content": "18C",
        "tool_call_id": "call_1",
        "name": "get_weather",
    }


def test_tool_choice_none_keeps_the_tools_in_the_prompt(http, served):
    """As vLLM by default: the prompt is the one auto would get; nothing is parsed."""
    r = http.post(
        "/v1/chat/completions", json={"messages": CHAT, "tools": [WEATHER], "tool_choice": "none"}
    )
    assert r.status_code == 200, r.text
    assert served.backend.requests[-1].tools == [WEATHER]
    assert "tool_calls" not in r.json()["choices"][0]["message"]
