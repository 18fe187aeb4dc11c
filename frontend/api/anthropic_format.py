"""The chat path's outputs in Anthropic's Messages shapes: one message, or its events.

A whole response is the chat response (frontend.api.openai_format.ChatFormat, or ToolChatFormat
when the text is parsed for tool calls) translated: reasoning_content (--reasoning-parser)
→ a thinking block first (`signature` ""), content → a text block, each tool call → a
tool_use block (`input`: the arguments as an object), finish_reason → stop_reason.
A stream is Anthropic's server-sent events, each with its `event:` line:

    message_start (content [], usage.input_tokens)   ping
    content_block_start {index, thinking | text | tool_use}  a block opens when its first
    content_block_delta thinking_delta | text_delta | input_json_delta   text (or tool call
                                                            name) arrives;
    content_block_stop                                      it closes when the next opens
    ...                                                     or the message ends
    message_delta {stop_reason, stop_sequence} usage       message_stop
    event: error {"type": "error", "error": {...}}   a failure after the first output

Tool calls are read from the streamed text by the chat path's ToolStream (the same parser
and states as streamed chat tool calls), so a tool_use block's partial_json fragments join
into its arguments. Usage follows Anthropic's split: `input_tokens` are the prompt tokens
the prefix cache did not serve, `cache_read_input_tokens` those it did (the chat usage's
prompt_tokens_details.cached_tokens, when the chat path reports it).
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from common.tool_formats import ToolFormat
from frontend.api.openai_format import Choice, ResponseFormat, dumps
from frontend.errors import APIError
from frontend.logprobs import TokenLogprob
from frontend.request_handle import Delta
from frontend.tools.stream import ToolStream

# HTTP status -> Anthropic's error type
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    415: "invalid_request_error",
    429: "overloaded_error",
    503: "overloaded_error",
    504: "timeout_error",
    529: "overloaded_error",
}


def error_body(status: int, message: str) -> dict[str, Any]:
    kind = ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


def event(name: str, data: dict[str, Any]) -> str:
    return f"event: {name}\ndata: {dumps(data)}\n\n"


def tool_use_id() -> str:
    return f"toolu_{uuid.uuid4().hex[:24]}"


def tool_input(arguments: str) -> dict[str, Any]:
    """A call's arguments as the object Anthropic's `input` is ({} if they are not one)."""
    try:
        value = json.loads(arguments)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def stop_reason(
    finish: str | None, stop: str | int | None, called: bool, stops: list[str]
) -> tuple[str, str | None]:
    """(stop_reason, stop_sequence) for a chat finish_reason and the matched stop."""
    if called and finish in ("stop", "tool_calls"):
        return "tool_use", None
    if finish == "length":
        return "max_tokens", None
    if finish == "stop" and isinstance(stop, str) and stop in stops:
        return "stop_sequence", stop
    return "end_turn", None


def usage_of(chat_usage: dict[str, Any]) -> dict[str, int]:
    details = chat_usage.get("prompt_tokens_details") or {}
    cached = details.get("cached_tokens") or 0
    return {
        "input_tokens": chat_usage["prompt_tokens"] - cached,
        "output_tokens": chat_usage["completion_tokens"],
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached,
    }


class AnthropicFormat(ResponseFormat):
    """One message (n = 1) over the chat format `chat`; `parser`: the tool-call parser
    when the text is parsed (tools with tool_choice other than none)."""

    def __init__(
        self, chat: ResponseFormat, parser: ToolFormat | None, model: str, stops: list[str]
    ) -> None:
        super().__init__(f"msg_{uuid.uuid4().hex[:24]}", model, chat.created, False)
        self.chat, self.stops = chat, stops
        self.tools = ToolStream(parser) if parser is not None else None
        self.num_blocks = 0
        self.open: str | None = None  # the type of the block open in the stream
        self.call_blocks: dict[int, int] = {}  # tool call index -> its block's index

    def filter(self, d: Delta) -> Delta:
        return self.chat.filter(d)  # the chat side splits off the reasoning

    def response(self, choices: list[Choice]) -> dict[str, Any]:
        chat = self.chat.response(choices)
        choice = chat["choices"][0]
        message = choice["message"]
        content: list[dict[str, Any]] = []
        if message.get("reasoning_content"):
            thinking = message["reasoning_content"]
            content.append({"type": "thinking", "thinking": thinking, "signature": ""})
        if message.get("content"):
            content.append({"type": "text", "text": message["content"]})
        calls = message.get("tool_calls") or []
        for call in calls:
            fn = call["function"]
            content.append(
                {
                    "type": "tool_use",
                    "id": tool_use_id(),
                    "name": fn["name"],
                    "input": tool_input(fn["arguments"]),
                }
            )
        reason, sequence = stop_reason(
            choice["finish_reason"], choice.get("stop_reason"), bool(calls), self.stops
        )
        return {
            **self._message(content),
            "stop_reason": reason,
            "stop_sequence": sequence,
            "usage": usage_of(chat["usage"]),
        }

    def _message(self, content: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": content,
        }

    # -- the stream ---------------------------------------------------------------------
    def stream_start(self, n: int, num_prompt_tokens: int = 0) -> list[str]:
        usage = {"input_tokens": num_prompt_tokens, "output_tokens": 0}
        message = {**self._message([]), "stop_reason": None, "stop_sequence": None}
        return [
            event(
                "message_start", {"type": "message_start", "message": {**message, "usage": usage}}
            ),
            event("ping", {"type": "ping"}),
        ]

    def stream_delta(self, d: Delta, offset: int, lps: list[TokenLogprob]) -> str:
        calls: list[dict[str, Any]] = []
        if self.tools is None:
            content = d.text
        else:
            content, calls = self.tools.feed(d.text, d.finish_reason is not None)
        parts: list[str] = []
        if d.reasoning:
            if self.open != "thinking":
                parts += self._start({"type": "thinking", "thinking": "", "signature": ""})
            delta = {"type": "thinking_delta", "thinking": d.reasoning}
            parts.append(self._delta(self.num_blocks - 1, delta))
        if content:
            if self.open != "text":
                parts += self._start({"type": "text", "text": ""})
            parts.append(self._delta(self.num_blocks - 1, {"type": "text_delta", "text": content}))
        for call in calls:
            fn = call["function"]
            if "name" in fn:  # a new call: its block opens
                block = {"type": "tool_use", "id": tool_use_id(), "name": fn["name"], "input": {}}
                parts += self._start(block)
                self.call_blocks[call["index"]] = self.num_blocks - 1
            if fragment := fn.get("arguments"):
                delta = {"type": "input_json_delta", "partial_json": fragment}
                parts.append(self._delta(self.call_blocks[call["index"]], delta))
        return "".join(parts)

    def _start(self, block: dict[str, Any]) -> list[str]:
        parts = self._stop()
        data = {"type": "content_block_start", "index": self.num_blocks, "content_block": block}
        self.num_blocks += 1
        self.open = block["type"]
        return [*parts, event("content_block_start", data)]

    def _stop(self) -> list[str]:
        if self.open is None:
            return []
        self.open = None
        data = {"type": "content_block_stop", "index": self.num_blocks - 1}
        return [event("content_block_stop", data)]

    def _delta(self, index: int, delta: dict[str, Any]) -> str:
        return event(
            "content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}
        )

    def stream_end(self, choices: list[Choice]) -> str:
        c = choices[0]
        called = self.tools is not None and self.tools.called
        reason, sequence = stop_reason(c.finish_reason, c.stop_reason, called, self.stops)
        usage = usage_of(self.chat.usage_chunk(choices)["usage"])
        delta = {"stop_reason": reason, "stop_sequence": sequence}
        return "".join(
            [
                *self._stop(),
                event("message_delta", {"type": "message_delta", "delta": delta, "usage": usage}),
                event("message_stop", {"type": "message_stop"}),
            ]
        )

    def stream_error(self, e: APIError) -> str:
        return event("error", error_body(e.status, e.message))
