"""POST /v1/messages and /v1/messages/count_tokens over the fake backend: the request the
chat path gets, the response and its SSE events, Anthropic's errors and API-key headers;
the tool-call translation on the format itself (the fake backend never calls a tool)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from common.tool_formats import tool_format
from frontend.api.anthropic_format import AnthropicFormat, stop_reason, usage_of
from frontend.api.openai_format import ChatFormat, Choice
from frontend.request_handle import Delta
from frontend.tools.chat_format import ToolChatFormat
from tests.frontend.conftest import Served, serve

WEATHER = {
    "name": "get_weather",
    "description": "The weather in a city",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}


def body(**kw: Any) -> dict[str, Any]:
    return {
        "model": "smollm2",
        "max_tokens": 16,
        "messages": [{"role": "user", "content": "Hi"}],
        **kw,
    }


def parse_events(text: str) -> list[tuple[str, dict[str, Any]]]:
    """(event name, data) per server-sent event; each must be `event:` then `data:`."""
    assert text.endswith("\n\n"), text[-80:]
    out = []
    for block in text[:-2].split("\n\n"):
        lines = block.split("\n")
        assert len(lines) == 2 and lines[0].startswith("event: "), block
        assert lines[1].startswith("data: "), block
        name, data = lines[0][len("event: ") :], json.loads(lines[1][len("data: ") :])
        assert data["type"] == name, block
        out.append((name, data))
    return out


def assert_error(r: httpx.Response, status: int, kind: str) -> str:
    assert r.status_code == status, r.text
    err = r.json()
    assert err["type"] == "error" and err["error"]["type"] == kind, err
    assert err["error"]["message"]
    return err["error"]["message"]


def test_message(served: Served, http: httpx.Client) -> None:
    r = http.post("/v1/messages", json=body(system="Be brief.", metadata={"user_id": "u1"}))
    assert r.status_code == 200, r.text
    m = r.json()
    assert m["id"].startswith("msg_") and m["type"] == "message" and m["role"] == "assistant"
    assert m["model"] == "smollm2"
    assert m["content"] == [{"type": "text", "text": "Hello world!"}]
    assert (m["stop_reason"], m["stop_sequence"]) == ("end_turn", None)
    u = m["usage"]
    assert u["input_tokens"] + u["cache_read_input_tokens"] == 5  # the fake's prompt length
    assert (u["output_tokens"], u["cache_creation_input_tokens"]) == (3, 0)
    sent = served.backend.requests[-1]
    assert sent.kind == "chat"
    assert sent.messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
    ]
    assert sent.params.max_tokens == 16 and sent.tools is None


def test_max_tokens_stop_reason(http: httpx.Client) -> None:
    m = http.post("/v1/messages", json=body(max_tokens=2)).json()
    assert (m["stop_reason"], m["content"][0]["text"]) == ("max_tokens", "Hello world")


def test_request_translation(served: Served, http: httpx.Client) -> None:
    """Blocks, tool history, tools, tool_choice and sampling fields reach the chat path."""
    messages = [
        {
            "role": "user",
            "content": [{"type": "text", "text": "Weather in "}, {"type": "text", "text": "Rome?"}],
        },
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "hmm", "signature": "s"},
                {"type": "text", "text": "Let me look."},
                {
                    "type": "tool_use",
                    "id": "toolu_1",
                    "name": "get_weather",
                    "input": {"city": "Rome"},
                },
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_1",
                    "content": [{"type": "text", "text": "sunny"}],
                },
                {"type": "text", "text": "And Paris?", "cache_control": {"type": "ephemeral"}},
            ],
        },
    ]
    system = [{"type": "text", "text": "You help.", "cache_control": {"type": "ephemeral"}}]
    r = http.post(
        "/v1/messages",
        json=body(
            messages=messages,
            system=system,
            tools=[WEATHER],
            tool_choice={"type": "tool", "name": "get_weather"},
            stop_sequences=["END"],
            temperature=0.5,
            top_p=0.9,
            top_k=7,
        ),
    )
    assert r.status_code == 200, r.text
    sent = served.backend.requests[-1]
    assert [(m["role"], m["content"]) for m in sent.messages] == [
        ("system", "You help."),
        ("user", "Weather in Rome?"),
        ("assistant", "Let me look."),
        ("tool", "sunny"),
        ("user", "And Paris?"),
    ]
    call = sent.messages[2]["tool_calls"][0]
    assert call["id"] == "toolu_1"
    assert call["function"] == {"name": "get_weather", "arguments": {"city": "Rome"}}
    assert sent.messages[3]["tool_call_id"] == "toolu_1"
    assert sent.tools == [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "parameters": WEATHER["input_schema"],
                "description": "The weather in a city",
            },
        }
    ]
    p = sent.params
    assert (p.temperature, p.top_p, p.top_k, p.stop) == (0.5, 0.9, 7, ["END"])
    assert p.structured is not None  # the named tool choice is forced by a grammar


@pytest.mark.parametrize(
    "choice,forced",
    [({"type": "auto"}, False), ({"type": "any"}, True), ({"type": "none"}, False)],
)
def test_tool_choice(served: Served, http: httpx.Client, choice: dict, forced: bool) -> None:
    r = http.post("/v1/messages", json=body(tools=[WEATHER], tool_choice=choice))
    assert r.status_code == 200, r.text
    sent = served.backend.requests[-1]
    assert sent.tools is not None and sent.tools[0]["function"]["name"] == "get_weather"
    assert (sent.params.structured is not None) == forced


def test_output_format(served: Served, http: httpx.Client) -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    fmt = {"format": {"type": "json_schema", "schema": schema}, "effort": "low"}
    assert http.post("/v1/messages", json=body(output_config=fmt)).status_code == 200
    assert served.backend.requests[-1].params.structured is not None
    r = http.post("/v1/messages", json=body(output_config={"format": {"type": "xml"}}))
    assert "output_config.format" in assert_error(r, 400, "invalid_request_error")


def test_stream_events(http: httpx.Client) -> None:
    r = http.post("/v1/messages", json=body(stream=True))
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = parse_events(r.text)
    names = [n for n, _ in events]
    assert names == [
        "message_start",
        "ping",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    start = events[0][1]["message"]
    assert start["content"] == [] and start["usage"]["input_tokens"] == 5
    assert events[2][1] == {
        "type": "content_block_start",
        "index": 0,
        "content_block": {"type": "text", "text": ""},
    }
    text = "".join(d["delta"]["text"] for n, d in events if n == "content_block_delta")
    assert text == "Hello world!"
    delta = events[-2][1]
    assert delta["delta"] == {"stop_reason": "end_turn", "stop_sequence": None}
    assert delta["usage"]["output_tokens"] == 3


def test_stream_error_mid_stream(http: httpx.Client) -> None:
    r = http.post(
        "/v1/messages", json=body(stream=True, messages=[{"role": "user", "content": "fail-late"}])
    )
    assert r.status_code == 200
    name, data = parse_events(r.text)[-1]
    assert name == "error" and data["error"]["type"] == "api_error", data


@pytest.mark.parametrize(
    "change,status,kind,words",
    [
        ({"max_tokens": None}, 400, "invalid_request_error", "max_tokens"),
        ({"max_tokens": 0}, 400, "invalid_request_error", "max_tokens"),
        ({"model": "claude-nonexistent"}, 404, "not_found_error", "claude-nonexistent"),
        ({"bogus": 1}, 400, "invalid_request_error", "bogus"),
        ({"temperature": "hot"}, 400, "invalid_request_error", "temperature"),
        ({"messages": []}, 400, "invalid_request_error", "messages"),
        (
            {
                "messages": [
                    {"role": "user", "content": [{"type": "image", "source": {"type": "base64"}}]}
                ]
            },
            400,
            "invalid_request_error",
            "image",
        ),
        (
            {"tool_choice": {"type": "tool", "name": "nope"}, "tools": [WEATHER]},
            400,
            "invalid_request_error",
            "nope",
        ),
        (
            {"tools": [{**WEATHER, "input_schema": {"type": "string"}}]},
            400,
            "invalid_request_error",
            "input_schema",
        ),
        (
            {"tools": [{"type": "web_search_20250305", "name": "w", "input_schema": {}}]},
            400,
            "invalid_request_error",
            "server tools",
        ),
        ({"messages": [{"role": "user", "content": "bad"}]}, 400, "invalid_request_error", "bad"),
        (
            {"messages": [{"role": "user", "content": "bad"}], "stream": True},
            400,
            "invalid_request_error",
            "bad",
        ),
    ],
)
def test_errors(http: httpx.Client, change: dict, status: int, kind: str, words: str) -> None:
    b = {k: v for k, v in {**body(), **change}.items() if v is not None}
    assert words in assert_error(http.post("/v1/messages", json=b), status, kind)


def test_count_tokens(served: Served, http: httpx.Client) -> None:
    r = http.post(
        "/v1/messages/count_tokens",
        json={"model": "smollm2", "system": "ab", "messages": [{"role": "user", "content": "cde"}]},
    )
    assert r.status_code == 200, r.text
    assert r.json() == {"input_tokens": 5}  # the fake: one token per character
    r = http.post(
        "/v1/messages/count_tokens",
        json={
            "model": "smollm2",
            "messages": [{"role": "user", "content": "x"}],
            "tools": [WEATHER],
        },
    )
    assert r.status_code == 200, r.text
    args = served.backend.calls[-1].args
    assert args["tools"][0]["function"]["name"] == "get_weather" and args["add_generation_prompt"]
    assert_error(
        http.post("/v1/messages/count_tokens", json={"model": "smollm2"}),
        400,
        "invalid_request_error",
    )


def test_api_key_headers_and_body_limit() -> None:
    with serve(api_key="sekrit", max_body_bytes=4096) as s, s.client() as c:
        assert_error(c.post("/v1/messages", json=body()), 401, "authentication_error")
        wrong = {"x-api-key": "nope"}
        assert_error(
            c.post("/v1/messages", json=body(), headers=wrong), 401, "authentication_error"
        )
        assert (
            c.post("/v1/messages", json=body(), headers={"x-api-key": "sekrit"}).status_code == 200
        )
        bearer = {"Authorization": "Bearer sekrit"}
        assert c.post("/v1/messages", json=body(), headers=bearer).status_code == 200
        chat = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
        r = c.post("/v1/chat/completions", json=chat, headers={"x-api-key": "sekrit"})
        assert r.status_code == 200, r.text  # either header, every route
        r = c.post("/v1/chat/completions", json=chat)
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        big = body(system="x" * 5000)
        r = c.post("/v1/messages", json=big, headers={"x-api-key": "sekrit"})
        assert_error(r, 413, "request_too_large")


# -- the format over tool calls (no HTTP) -----------------------------------------------------
CALL_TEXT = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>'


def delta(text: str, n: int, finish: str | None = None, stop: str | int | None = None) -> Delta:
    return Delta(0, text, finish, stop, 7, n, b"", None, None)


def anthropic_tool_format() -> AnthropicFormat:
    parser = tool_format("hermes")
    return AnthropicFormat(ToolChatFormat("x", "m", 0, False, parser=parser), parser, "m", [])


def test_tool_use_response() -> None:
    fmt, c = anthropic_tool_format(), Choice(0)
    c.add(delta("Sure. " + CALL_TEXT, 9, "stop"), keep=True)
    m = fmt.response([c])
    assert m["content"][0] == {"type": "text", "text": "Sure."}  # the parser trims it
    use = m["content"][1]
    assert use["type"] == "tool_use" and use["id"].startswith("toolu_")
    assert (use["name"], use["input"]) == ("get_weather", {"city": "Rome"})
    assert m["stop_reason"] == "tool_use"


def test_tool_use_stream() -> None:
    fmt, c = anthropic_tool_format(), Choice(0)
    parts = fmt.stream_start(1, 7)
    pieces = ["Sure. ", *[CALL_TEXT[i : i + 9] for i in range(0, len(CALL_TEXT), 9)]]
    for i, piece in enumerate(pieces):
        d = delta(piece, i + 1, "stop" if i == len(pieces) - 1 else None)
        c.add(d, keep=False)
        parts.append(fmt.stream_delta(d, 0, []))
    parts.append(fmt.stream_end([c]))
    events = parse_events("".join(parts))
    starts = [d["content_block"] for n, d in events if n == "content_block_start"]
    assert [b["type"] for b in starts] == ["text", "tool_use"]
    assert starts[1]["name"] == "get_weather" and starts[1]["input"] == {}
    partial = "".join(
        d["delta"]["partial_json"]
        for n, d in events
        if n == "content_block_delta" and d["index"] == 1
    )
    assert json.loads(partial) == {"city": "Rome"}
    stops = [d["index"] for n, d in events if n == "content_block_stop"]
    assert stops == [0, 1]
    assert events[-2][1]["delta"]["stop_reason"] == "tool_use"
    assert [n for n, _ in events][-2:] == ["message_delta", "message_stop"]


def test_stop_sequence() -> None:
    fmt, c = AnthropicFormat(ChatFormat("x", "m", 0, False), None, "m", ["END"]), Choice(0)
    c.add(delta("abc", 3, "stop", "END"), keep=True)
    m = fmt.response([c])
    assert (m["stop_reason"], m["stop_sequence"]) == ("stop_sequence", "END")
    assert stop_reason("stop", 2, False, ["END"]) == ("end_turn", None)  # EOS token id
    assert stop_reason("length", None, False, []) == ("max_tokens", None)


def test_usage_splits_cached_tokens() -> None:
    """Anthropic's input_tokens exclude the prefix-cache hits, reported apart."""
    chat = {
        "prompt_tokens": 10,
        "completion_tokens": 3,
        "prompt_tokens_details": {"cached_tokens": 8},
    }
    assert usage_of(chat) == {
        "input_tokens": 2,
        "output_tokens": 3,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 8,
    }
    assert usage_of({"prompt_tokens": 4, "completion_tokens": 1})["input_tokens"] == 4
