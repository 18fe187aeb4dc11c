"""The formats whose calls are JSON objects {"name": ..., "arguments"|"parameters": {...}}
(hermes, llama3_json, mistral): the JSON scanner their parsers share, and how such a call
is written in a prompt and in a grammar."""

from __future__ import annotations

import json
from typing import Any

from common.schema_bounds import split_options
from common.tool_formats.base import PartialCall, ToolFormat, dumps, lit, schema_rule, skip_ws


def scan_json(text: str, start: int) -> int | None:
    """The end (exclusive) of the JSON value that begins at text[start] (an object, array,
    string or scalar), or None when the text ends before it does. Strings and escapes are
    respected; the value is not validated (json.loads does that on the whole)."""
    n = len(text)
    if start >= n:
        return None
    c = text[start]
    if c == '"':
        i = start + 1
        while i < n:
            if text[i] == "\\":
                i += 2
                continue
            if text[i] == '"':
                return i + 1
            i += 1
        return None
    if c not in "{[":
        i = start
        while i < n and text[i] not in ",}] \t\r\n":
            i += 1
        return i if i < n else None  # a scalar may still grow
    depth, i, in_str = 0, start, False
    while i < n:
        ch = text[i]
        if in_str:
            if ch == "\\":
                i += 1
            elif ch == '"':
                in_str = False
        elif ch == '"':
            in_str = True
        elif ch in "{[":
            depth += 1
        elif ch in "}]":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return None


def json_object(text: str) -> dict[str, Any] | None:
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


class JsonCallsFormat(ToolFormat):
    """A format whose calls are JSON objects; ARGS_KEY is the one its prompt and grammar
    write, the parser reads either."""

    ARG_KEYS = ("arguments", "parameters")
    ARGS_KEY = "arguments"

    def write_call(self, fn: dict[str, Any]) -> str:
        args = fn.get("arguments", {})
        args_text = args if isinstance(args, str) else dumps(args)
        return f'{{"name": {dumps(fn.get("name"))}, "{self.ARGS_KEY}": {args_text}}}'

    def call_rules(self, fn: dict[str, Any], k: int) -> list[str]:
        head = f'{{"name": {dumps(fn["name"])}, "{self.ARGS_KEY}": '
        params, numbers = split_options(fn["parameters"])
        return [
            f"fn_{k}: {lit(head)} args_{k} {lit('}')}",
            f"args_{k}: {schema_rule(params, numbers)}",
        ]

    def object_run(self, text: str, i: int, sep: str) -> list[PartialCall]:
        """The calls of the JSON objects from text[i] on, `sep` between them (the last one
        maybe incomplete); stops at anything else, and after a malformed one."""
        out: list[PartialCall] = []
        while i < len(text) and text[i] == "{":
            end = scan_json(text, i)
            call = self.object_call(text[i:] if end is None else text[i:end])
            if call is None:
                break
            out.append(call)
            if end is None or not call.done:  # still written, or malformed: the run ends
                break
            i = skip_ws(text, end)
            if i < len(text) and text[i] == sep:
                i = skip_ws(text, i + 1)
        return out

    def object_call(self, body: str) -> PartialCall | None:
        """One call from the text of its JSON object (maybe incomplete), or None when it has
        no complete name yet. Keys are read in order, so "arguments" may come first. A
        call is done once its arguments are a complete JSON object; one cut short or
        malformed is returned not done (a whole response drops it, a stream has sent its
        start and keeps its index)."""
        i = skip_ws(body, 0)
        if i >= len(body) or body[i] != "{":
            return None
        i += 1
        name: str | None = None
        args: str | None = None
        args_done = False
        while True:
            i = skip_ws(body, i)
            if i >= len(body) or body[i] != '"':
                break
            key_end = scan_json(body, i)
            if key_end is None:
                break
            key = json.loads(body[i:key_end])
            i = skip_ws(body, key_end)
            if i >= len(body) or body[i] != ":":
                break
            i = skip_ws(body, i + 1)
            if i >= len(body):
                break
            end = scan_json(body, i)
            if key == "name":
                if end is None:
                    break
                value = json.loads(body[i:end]) if body[i] == '"' else None
                name = value if isinstance(value, str) else None
            elif key in self.ARG_KEYS and args is None:
                args = body[i:] if end is None else body[i:end]
                args_done = end is not None
                if end is None:
                    break
            elif end is None:
                break
            i = skip_ws(body, end)
            if i < len(body) and body[i] == ",":
                i += 1
        if name is None:
            return None
        if args is None:
            # arguments not begun: none if the object closed without any; cut before its
            # arguments or its closing brace (max_tokens, a stop), it is not a call
            complete = i < len(body) and body[i] == "}"
            return PartialCall(name, "{}" if complete else "", complete)
        if args_done and json_object(args) is None:
            return PartialCall(name, args, False)  # malformed: never done
        return PartialCall(name, args, args_done)
