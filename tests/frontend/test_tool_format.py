"""Chat responses with tools (frontend.tools.chat_format): whole responses and SSE chunks built
from engine outputs, choice by choice, against the parser's reading of the same text."""

from __future__ import annotations

import json

from common.tool_formats import tool_format
from frontend.api.openai_format import Choice
from frontend.request_handle import Delta
from frontend.tools.chat_format import ToolChatFormat

CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def _fmt() -> ToolChatFormat:
    return ToolChatFormat("chatcmpl-1", "m", 0, False, parser=tool_format("hermes"))


def _deltas(index: int, pieces: list[str], reason: str = "stop") -> list[Delta]:
    last = len(pieces) - 1
    return [
        Delta(index, p, reason if k == last else None, None, 5, k + 1, b"", None, None)
        for k, p in enumerate(pieces)
    ]


def test_whole_response_has_tool_calls_and_finish_reason():
    fmt = _fmt()
    texts = ["Checking. " + CALL, "Just text."]
    choices = []
    for i, text in enumerate(texts):
        c = Choice(i)
        for d in _deltas(i, [text[:7], text[7:]]):
            c.add(d, keep=True)
        choices.append(c)
    body = fmt.response(choices)
    first, second = body["choices"]
    assert first["finish_reason"] == "tool_calls"
    assert first["message"]["content"] == "Checking."
    (call,) = first["message"]["tool_calls"]
    assert call["type"] == "function" and call["id"].startswith("call_")
    assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    assert second["finish_reason"] == "stop"
    assert second["message"] == {"role": "assistant", "content": "Just text."}


def test_a_call_cut_by_length_keeps_its_finish_reason():
    fmt = _fmt()
    c = Choice(0)
    for d in _deltas(0, [CALL], reason="length"):
        c.add(d, keep=True)
    out = fmt.response([c])["choices"][0]
    assert out["finish_reason"] == "length"  # complete call, but the model did not stop


def test_stream_chunks_interleaved_choices():
    """Two choices streamed together, one calling and one not: each gets its own state."""
    fmt = _fmt()
    a = _deltas(
        0,
        [
            "Hi <tool_",
            'call>\n{"name": "get_weather", ',
            '"arguments": {"city": "Par',
            'is"}}\n</tool_call>',
        ],
    )
    b = _deltas(1, ["No ", "call", "."])
    chunks = []
    for d in [x for pair in zip(a, b) for x in pair] + a[len(b) :]:
        part = fmt.stream_delta(d, 0, [])
        if part:
            chunks.append(json.loads(part.removeprefix("data: ")))
    content = {0: "", 1: ""}
    args, names, finish = "", [], {}
    for ch in chunks:
        entry = ch["choices"][0]
        i = entry["index"]
        content[i] += entry["delta"].get("content", "")
        for tc in entry["delta"].get("tool_calls", []):
            assert i == 0
            if "id" in tc:
                names.append(tc["function"]["name"])
            args += tc["function"].get("arguments", "")
        if entry["finish_reason"]:
            finish[i] = entry["finish_reason"]
    assert content == {0: "Hi ", 1: "No call."}
    assert names == ["get_weather"] and json.loads(args) == {"city": "Paris"}
    assert finish == {0: "tool_calls", 1: "stop"}
