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
fragments sent are always a prefix of the final arguments. They are sent only as far as
they are valid JSON (JsonPrefix, each call's scanned once as it grows): a model that
writes `{"city": Paris}` has sent `{"city": ` and no more, and what a client has
assembled always parses as partial JSON. When the text ends with a region that held no
call, the held text is sent as content after all. A choice "called" (finish_reason
"tool_calls") only if a call was completed.
"""

from __future__ import annotations

import uuid
from typing import Any

from common.tool_formats import PartialCall, ToolFormat
from common.tool_formats.json_prefix import JsonPrefix


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
        self.done: list[bool] = []  # per call index: its arguments complete (a JSON object)
        self.valid: list[JsonPrefix] = []  # per call index: how far its arguments are JSON

    @property
    def num_calls(self) -> int:
        return len(self.ids)

    @property
    def called(self) -> bool:
        """A call was completed: the choice finishes with "tool_calls", not "stop"."""
        return any(self.done)

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
        # read as still growing even at the end: a malformed call then stays in its place
        # (not done) rather than dropped, which would move the later calls' indexes
        deltas = self._deltas(self.parser.calls(self.text[self.region :], False))
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
                self.done.append(False)
                self.valid.append(JsonPrefix())
                out.append(
                    {
                        "index": i,
                        "id": self.ids[i],
                        "type": "function",
                        "function": {"name": c.name, "arguments": ""},
                    }
                )
            self.done[i] = self.done[i] or c.done
            valid = c.arguments if c.done else c.arguments[: self.valid[i].extend(c.arguments)]
            fragment = valid[self.args_sent[i] :]
            if fragment:
                self.args_sent[i] = len(valid)
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
