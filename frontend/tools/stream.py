"""One streamed choice's tool calls, as OpenAI streams them: the text turned into content
deltas and `delta.tool_calls` entries.

    text so far:  "Sure. <tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>"
                   └content┘└ region (parser.start) ─────────────────────────────────┘
    deltas:  {"content": "Sure. "}                       (text that cannot begin a call)
             {"tool_calls": [{"index": 0, "id": "call_…", "type": "function",
                              "function": {"name": "f", "arguments": ""}}]}  (name first)
             {"tool_calls": [{"index": 0, "function": {"arguments": "{\"a\": "}}]} ...

States: CONTENT (no region yet; the tail that may still be the start of a region is held
back, parser.hold_back) -> CALLS (everything after the region's start belongs to the
calls). The invariant the parsers keep: a call's arguments text only grows, so the
fragments sent are always a prefix of the final arguments. When the text ends with a
region that held no call, the held text is sent as content after all.
"""

from __future__ import annotations

import uuid
from typing import Any

from common.tool_formats import PartialCall, ToolFormat


def call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


class ToolStream:
    def __init__(self, parser: ToolFormat) -> None:
        self.parser = parser
        self.text = ""
        self.sent = 0  # chars of text sent as content
        self.region: int | None = None  # where the calls begin, once seen
        self.ids: list[str] = []  # per call index sent so far
        self.args_sent: list[int] = []  # chars of each call's arguments sent

    @property
    def num_calls(self) -> int:
        return len(self.ids)

    def feed(self, text: str, final: bool) -> tuple[str, list[dict[str, Any]]]:
        """(content to send, tool_calls delta entries) for the next piece of text."""
        self.text += text
        content = ""
        if self.region is None:
            at = self.parser.start(self.text)
            if at is None:
                hold = 0 if final else self.parser.hold_back(self.text)
                end = len(self.text) - hold
                content, self.sent = self.text[self.sent : end], max(self.sent, end)
                return content, []
            self.region = at
            content, self.sent = self.text[self.sent : at], at
        calls = self.parser.calls(self.text[self.region :], final)
        if final:
            calls = [c for c in calls if c.done]
        deltas = self._deltas(calls)
        if final and not self.ids:  # a region with no call in it: it was content
            content += self.text[self.sent :]
            self.sent = len(self.text)
        return content, deltas

    def _deltas(self, calls: list[PartialCall]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for i, c in enumerate(calls):
            if c.name is None:
                break
            if i == len(self.ids):
                self.ids.append(call_id())
                self.args_sent.append(0)
                out.append(
                    {
                        "index": i,
                        "id": self.ids[i],
                        "type": "function",
                        "function": {"name": c.name, "arguments": ""},
                    }
                )
            fragment = c.arguments[self.args_sent[i] :]
            if fragment:
                self.args_sent[i] = len(c.arguments)
                if out and out[-1]["index"] == i:
                    out[-1]["function"]["arguments"] += fragment
                else:
                    out.append({"index": i, "function": {"arguments": fragment}})
        return out


def message_calls(calls: list[PartialCall]) -> list[dict[str, Any]]:
    """A whole response's message.tool_calls."""
    return [
        {
            "id": call_id(),
            "type": "function",
            "function": {"name": c.name, "arguments": c.arguments},
        }
        for c in calls
    ]
