"""A chat request's messages as the chat template takes them: text parts joined, other
parts refused, assistant tool calls and tool results kept as templates expect them."""

from __future__ import annotations

import json
from typing import Any

from frontend.api.openai_protocol import ChatMessage
from frontend.errors import invalid


def chat_messages(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    """[{"role", "content"[, "name"][, "tool_calls"][, "tool_call_id"]}] with text parts
    joined; other parts are refused. Assistant tool calls and tool results are kept as
    chat templates take them (history_tool_calls)."""
    if not messages:
        raise invalid("messages must not be empty", "messages")
    out: list[dict[str, Any]] = []
    for i, m in enumerate(messages):
        if m.function_call:  # the deprecated functions API is not served
            raise invalid(
                "function_call is not supported by this server; use tool_calls",
                f"messages.{i}.function_call",
            )
        if m.tool_calls and m.role != "assistant":
            where = f"messages.{i}.tool_calls"
            raise invalid(f"{where}: only assistant messages have tool_calls", where)
        if m.role == "tool" and not m.tool_call_id:
            where = f"messages.{i}.tool_call_id"
            raise invalid(f"{where}: a tool message needs its tool_call_id", where)
        if m.content is None or isinstance(m.content, str):
            content = m.content or ""
        else:
            bad = [p.type for p in m.content if p.type != "text"]
            if bad:
                raise invalid(
                    f"content part type {bad[0]!r} is not supported", f"messages.{i}.content"
                )
            content = "".join(p.text or "" for p in m.content)
        msg: dict[str, Any] = {"role": m.role, "content": content}
        if m.name is not None:
            msg["name"] = m.name
        if m.tool_calls:
            msg["tool_calls"] = history_tool_calls(m.tool_calls, f"messages.{i}.tool_calls")
        if m.role == "tool":
            msg["tool_call_id"] = m.tool_call_id
            if "name" not in msg and (name := _called(out, m.tool_call_id)) is not None:
                msg["name"] = name  # some templates show the function's name
        out.append(msg)
    return out


def _called(history: list[dict[str, Any]], call_id: str | None) -> str | None:
    """The name of the function an earlier assistant message called with this id."""
    for msg in reversed(history):
        for call in msg.get("tool_calls", ()):
            if call.get("id") == call_id:
                return call["function"]["name"]
    return None


def history_tool_calls(calls: list[Any], where: str) -> list[dict[str, Any]]:
    """An assistant message's tool_calls as chat templates take them: arguments decoded
    to an object when they are JSON (transformers' convention), else kept as the string."""
    out = []
    for j, call in enumerate(calls):
        at = f"{where}.{j}"
        if not isinstance(call, dict) or not isinstance(call.get("function"), dict):
            raise invalid(
                f"{at}: a tool call is {{'id', 'type', 'function': {{name, arguments}}}}", at
            )
        fn = call["function"]
        if not isinstance(fn.get("name"), str):
            raise invalid(f"{at}.function.name: must be a string", f"{at}.function.name")
        args = fn.get("arguments", "{}")
        if not isinstance(args, str):
            raise invalid(
                f"{at}.function.arguments: must be a JSON string", f"{at}.function.arguments"
            )
        try:
            decoded: Any = json.loads(args)
        except ValueError:
            decoded = args
        entry: dict[str, Any] = {
            "type": "function",
            "function": {"name": fn["name"], "arguments": decoded},
        }
        if isinstance(call.get("id"), str):
            entry["id"] = call["id"]
        out.append(entry)
    return out
