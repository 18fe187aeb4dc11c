"""What a chat completion becomes in the Responses API: the response object, and the event
stream built from the chat stream's chunks.

```
 chat JSON ───────────────▶ response_object ──▶ {"object": "response", "output": [...]}
 chat SSE chunks ─▶ EventStream.feed ─▶ response.created, .in_progress,
                        output_item.added ─▶ content_part.added ─▶ output_text.delta × k
                        ─▶ output_text.done ─▶ content_part.done ─▶ output_item.done,
                        (function calls: output_item.added ─▶ function_call_arguments.delta
                        × k ─▶ .done ─▶ output_item.done; reasoning, first: output_item.added
                        ─▶ content_part.added ─▶ reasoning_text.delta × k ─▶ .done ─▶
                        content_part.done ─▶ output_item.done), then response.completed
                        (.incomplete at max_output_tokens), or an `error` event
```
Every event has a `sequence_number` counting from 0. The chat side already parsed tool
calls (frontend.tools.chat_format), so here it is only a change of shape.
"""

from __future__ import annotations

import json
import uuid
from typing import Any


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def usage_of(chat_usage: dict[str, Any] | None) -> dict[str, Any] | None:
    """Chat's usage as the Responses API names it (cached tokens when chat reports them)."""
    if not chat_usage:
        return None
    details = chat_usage.get("prompt_tokens_details") or {}
    reasoning = (chat_usage.get("completion_tokens_details") or {}).get("reasoning_tokens")
    num_in, num_out = chat_usage.get("prompt_tokens", 0), chat_usage.get("completion_tokens", 0)
    return {
        "input_tokens": num_in,
        "input_tokens_details": {"cached_tokens": details.get("cached_tokens") or 0},
        "output_tokens": num_out,
        "output_tokens_details": {"reasoning_tokens": reasoning or 0},
        "total_tokens": num_in + num_out,
    }


def message_item(text: str, status: str = "completed", item_id: str | None = None) -> dict:
    return {
        "type": "message",
        "id": item_id or new_id("msg"),
        "status": status,
        "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }


def reasoning_item(text: str, item_id: str | None = None) -> dict[str, Any]:
    """The chat message's reasoning_content (--reasoning-parser) as a reasoning item."""
    return {
        "type": "reasoning",
        "id": item_id or new_id("rs"),
        "summary": [],
        "content": [{"type": "reasoning_text", "text": text}],
    }


def function_call_item(call: dict[str, Any], item_id: str | None = None) -> dict[str, Any]:
    fn = call.get("function") or {}
    return {
        "type": "function_call",
        "id": item_id or new_id("fc"),
        "call_id": call.get("id") or new_id("call"),
        "name": fn.get("name", ""),
        "arguments": fn.get("arguments", ""),
        "status": "completed",
    }


ITEM_ID_PREFIX = {"message": "msg", "function_call": "fc", "function_call_output": "fco"}


def with_ids(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Input items as a stored response keeps them: each with an id (a client's, or a new
    one), the id that GET /v1/responses/{id}/input_items pages by."""
    return [
        item if item.get("id") else {**item, "id": new_id(ITEM_ID_PREFIX.get(item["type"], "it"))}
        for item in items
    ]


def listed_item(item: dict[str, Any]) -> dict[str, Any]:
    """A stored input item as input_items lists it: a message's text as an input_text
    part (output_text for the assistant's), with a status, as OpenAI lists them."""
    if item["type"] != "message" or not isinstance(item.get("content"), str):
        return item
    part = "output_text" if item.get("role") == "assistant" else "input_text"
    return {
        **item,
        "content": [{"type": part, "text": item["content"]}],
        "status": item.get("status", "completed"),
    }


def finished(base: dict[str, Any], output: list, finish: str | None, usage: dict | None) -> dict:
    """`base` (the echoed request fields) completed with its output and usage."""
    incomplete = finish == "length"
    return {
        **base,
        "status": "incomplete" if incomplete else "completed",
        "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
        "output": output,
        "usage": usage,
    }


def response_object(base: dict[str, Any], chat: dict[str, Any]) -> dict[str, Any]:
    """The response for a whole chat completion (its one choice)."""
    choice = chat["choices"][0]
    message = choice.get("message") or {}
    calls = message.get("tool_calls") or []
    text = message.get("content") or ""
    finish = choice.get("finish_reason")
    output: list[dict[str, Any]] = []
    if message.get("reasoning_content"):
        output.append(reasoning_item(message["reasoning_content"]))
    if text or not calls:
        output.append(message_item(text, "incomplete" if finish == "length" else "completed"))
    output.extend(function_call_item(c) for c in calls)
    return finished(base, output, finish, usage_of(chat.get("usage")))


def sse_event(event: dict[str, Any]) -> str:
    data = json.dumps(event, ensure_ascii=False, separators=(",", ":"))
    return f"event: {event['type']}\ndata: {data}\n\n"


class EventStream:
    """The Responses events for one chat stream, chunk by chunk. `feed` takes a parsed
    chat chunk and returns the events it makes; `done` (at the chat stream's [DONE]) the
    closing ones, after which `response` is the whole response object."""

    def __init__(self, base: dict[str, Any]) -> None:
        self.base = base
        self.seq = 0
        self.output: list[dict[str, Any]] = []  # items, the open one last while `open`
        self.open: dict[str, Any] | None = None  # the item being streamed
        self.calls: dict[int, dict[str, Any]] = {}  # chat tool-call index -> its item
        self.finish: str | None = None
        self.usage: dict[str, Any] | None = None
        self.response: dict[str, Any] | None = None
        self.failed = False

    def _event(self, type: str, **fields: Any) -> dict[str, Any]:
        event = {"type": type, "sequence_number": self.seq, **fields}
        self.seq += 1
        return event

    def start(self) -> list[dict[str, Any]]:
        pending = {
            **self.base,
            "status": "in_progress",
            "incomplete_details": None,
            "output": [],
            "usage": None,
        }
        return [
            self._event("response.created", response=pending),
            self._event("response.in_progress", response=pending),
        ]

    def feed(self, chunk: dict[str, Any]) -> list[dict[str, Any]]:
        if "error" in chunk:
            return self.error(chunk["error"])
        if chunk.get("usage"):
            self.usage = usage_of(chunk["usage"])
        events: list[dict[str, Any]] = []
        for choice in chunk.get("choices") or ():
            delta = choice.get("delta") or {}
            if delta.get("reasoning_content"):
                events += self._text(delta["reasoning_content"], "reasoning")
            if delta.get("content"):
                events += self._text(delta["content"])
            for call in delta.get("tool_calls") or ():
                events += self._call(call)
            if choice.get("finish_reason") is not None:
                self.finish = choice["finish_reason"]
        return events

    def error(self, err: dict[str, Any]) -> list[dict[str, Any]]:
        self.failed = True
        return [
            self._event(
                "error",
                code=err.get("code"),
                message=err.get("message", "internal error"),
                param=err.get("param"),
            )
        ]

    def done(self) -> list[dict[str, Any]]:
        if self.failed:
            return []
        events = self._close()
        if all(i["type"] == "reasoning" for i in self.output):  # no answer: an empty message
            events += self._open(message_item("", "in_progress"))
            events += self._close()
        self.response = finished(self.base, self.output, self.finish, self.usage)
        kind = "response.incomplete" if self.finish == "length" else "response.completed"
        return [*events, self._event(kind, response=self.response)]

    # -- items ------------------------------------------------------------------------------
    def _where(self) -> dict[str, Any]:
        assert self.open is not None
        return {"item_id": self.open["id"], "output_index": len(self.output) - 1}

    def _open(self, item: dict[str, Any]) -> list[dict[str, Any]]:
        self.open = item
        self.output.append(item)
        shown = {**item, "content": []} if "content" in item else dict(item)
        if item["type"] == "function_call":
            shown["status"] = "in_progress"
        events = [
            self._event("response.output_item.added", output_index=len(self.output) - 1, item=shown)
        ]
        if "content" in item:
            part = dict(item["content"][0], text="")
            events.append(
                self._event(
                    "response.content_part.added", **self._where(), content_index=0, part=part
                )
            )
        return events

    def _close(self) -> list[dict[str, Any]]:
        item = self.open
        if item is None:
            return []
        where = self._where()
        events = []
        if "content" in item:
            part = item["content"][0]
            done: dict[str, Any] = {"text": part["text"]}
            if item["type"] == "message":
                item["status"] = "incomplete" if self.finish == "length" else "completed"
                done["logprobs"] = []
            kind = "output_text" if item["type"] == "message" else "reasoning_text"
            events += [
                self._event(f"response.{kind}.done", **where, content_index=0, **done),
                self._event("response.content_part.done", **where, content_index=0, part=part),
            ]
        else:
            item["status"] = "completed"
            events.append(
                self._event(
                    "response.function_call_arguments.done",
                    **where,
                    name=item["name"],
                    arguments=item["arguments"],
                )
            )
        events.append(
            self._event("response.output_item.done", output_index=where["output_index"], item=item)
        )
        self.open = None
        return events

    def _text(self, text: str, kind: str = "message") -> list[dict[str, Any]]:
        """Text for the open item of type `kind` (message or reasoning), opened here."""
        events: list[dict[str, Any]] = []
        if self.open is None or self.open["type"] != kind:
            events += self._close()
            item = message_item("", "in_progress") if kind == "message" else reasoning_item("")
            events += self._open(item)
        assert self.open is not None
        self.open["content"][0]["text"] += text
        if kind == "message":
            delta = self._event(
                "response.output_text.delta",
                **self._where(),
                content_index=0,
                delta=text,
                logprobs=[],
            )
        else:
            delta = self._event(
                "response.reasoning_text.delta", **self._where(), content_index=0, delta=text
            )
        events.append(delta)
        return events

    def _call(self, call: dict[str, Any]) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        index = call.get("index", 0)
        item = self.calls.get(index)
        if item is None:  # a new call: its first delta carries id and name
            events += self._close()
            item = function_call_item(
                {**call, "function": {**call.get("function", {}), "arguments": ""}}
            )
            self.calls[index] = item
            events += self._open(item)
        fragment = (call.get("function") or {}).get("arguments") or ""
        if fragment:
            item["arguments"] += fragment
        if fragment and item is self.open:  # (a call already closed keeps its whole text)
            events.append(
                self._event(
                    "response.function_call_arguments.delta", **self._where(), delta=fragment
                )
            )
        return events


def chat_chunks(buffer: str) -> tuple[list[dict[str, Any] | None], str]:
    """The complete SSE events in `buffer` (None for [DONE]) and the rest of it."""
    out: list[dict[str, Any] | None] = []
    *whole, rest = buffer.split("\n\n")
    for event in whole:
        for line in event.splitlines():
            if line.startswith("data: "):
                data = line[len("data: ") :]
                out.append(None if data == "[DONE]" else json.loads(data))
    return out, rest
