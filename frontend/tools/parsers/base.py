"""What every tool-call parser shares: the calls it finds, the JSON scanner, the base class.

A parser reads a chat completion's text in two parts:

    "Let me check. <tool_call>{...}</tool_call>"
     └── content ─┘└──────── tool-call region ────────┘
                   ^ start(text): where the region begins (None: no call yet)

`calls(region, final)` lists the calls found in the region so far, each with its name
once the name is complete and the raw text of its arguments as written so far. While
the text is still growing (`final` False), a call's `arguments` only ever grows: what a
stream sent stays a prefix of what it will send (frontend.tools.stream relies on it).
With `final`, every call's arguments are a complete JSON object, or the call is dropped.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


@dataclass
class PartialCall:
    name: str | None  # None until the name is complete
    arguments: str  # raw JSON text of the arguments so far (a complete object once done)
    done: bool = False  # the arguments are complete


@dataclass(frozen=True)
class ParsedCalls:
    content: str | None  # the text outside the calls; None when there is none
    calls: list[PartialCall]


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


def skip_ws(text: str, i: int) -> int:
    while i < len(text) and text[i] in " \t\r\n":
        i += 1
    return i


def json_object(text: str) -> dict[str, Any] | None:
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def marker_prefix_len(text: str, marker: str) -> int:
    """The length of the longest suffix of text that is a proper prefix of marker: text a
    stream must hold back, as it may be the start of the marker."""
    for k in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:k]):
            return k
    return 0


class ToolParser:
    """Base: a family's tool-call format. Subclasses set `name` and implement `start` and
    `calls`; `hold_back` says how much of a text without a region yet may still turn
    out to begin one."""

    name = ""
    # whether the format uses special tokens the detokenizer must keep (skip_special_tokens)
    needs_special_tokens = False
    # the text that opens a region wherever it stands (hermes, mistral): start and
    # hold_back follow from it; a format that opens otherwise overrides them
    marker = ""

    def start(self, text: str) -> int | None:
        if not self.marker:
            raise NotImplementedError
        at = text.find(self.marker)
        return None if at < 0 else at

    def hold_back(self, text: str) -> int:
        if not self.marker:
            raise NotImplementedError
        return marker_prefix_len(text, self.marker)

    def calls(self, region: str, final: bool) -> list[PartialCall]:
        raise NotImplementedError

    def parse(self, text: str) -> ParsedCalls:
        """A whole completion: its content and its complete calls. A region whose calls do
        not parse leaves the whole text as content."""
        at = self.start(text)
        if at is None:
            return ParsedCalls(text, [])
        calls = [c for c in self.calls(text[at:], final=True) if c.done and c.name]
        if not calls:
            return ParsedCalls(text, [])
        content = text[:at].strip()
        return ParsedCalls(content or None, calls)


class JsonCallsParser(ToolParser):
    """Formats whose calls are JSON objects {"name": ..., "arguments"|"parameters": {...}}."""

    ARG_KEYS = ("arguments", "parameters")

    def object_run(self, text: str, i: int, sep: str, final: bool) -> list[PartialCall]:
        """The calls of the JSON objects from text[i] on, `sep` between them (the last one
        maybe incomplete); stops at anything else."""
        out: list[PartialCall] = []
        while i < len(text) and text[i] == "{":
            end = scan_json(text, i)
            call = self.object_call(
                text[i:] if end is None else text[i:end], final or end is not None
            )
            if call is None:
                break
            out.append(call)
            if end is None:
                break
            i = skip_ws(text, end)
            if i < len(text) and text[i] == sep:
                i = skip_ws(text, i + 1)
        return out

    def object_call(self, body: str, final: bool) -> PartialCall | None:
        """One call from the text of its JSON object (maybe incomplete), or None when it has
        no complete name yet. Keys are read in order, so "arguments" may come first."""
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
            # arguments not begun: none, unless the object is complete without any
            complete = final or (i < len(body) and body[i] == "}")
            return PartialCall(name, "{}" if complete else "", complete)
        if args_done and json_object(args) is None:
            return PartialCall(name, args, False) if not final else None
        if not args_done and final:
            return None
        return PartialCall(name, args, args_done)
