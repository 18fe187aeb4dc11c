"""Chat responses of a request with tools: ChatFormat with each choice's text read by the
tool-call parser. A whole response gets `message.tool_calls` (content: the text outside
the calls, or null); a stream gets `delta.tool_calls` from one ToolStream per choice. A
choice that called a tool and stopped on its own finishes with "tool_calls"."""

from __future__ import annotations

from typing import Any

from common.tool_formats import ToolFormat
from frontend.api.openai_format import ChatFormat, Choice, sse
from frontend.logprobs import TokenLogprob
from frontend.request_handle import Delta
from frontend.tools.stream import ToolStream, message_calls


def _finish(reason: str | None, called: bool) -> str | None:
    return "tool_calls" if called and reason == "stop" else reason


class ToolChatFormat(ChatFormat):
    def __init__(self, *args: Any, parser: ToolFormat, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.parser = parser
        self._streams: dict[int, ToolStream] = {}

    def _choice(self, c: Choice) -> dict[str, Any]:
        out = super()._choice(c)
        parsed = self.parser.parse(c.text)
        if parsed.calls:
            out["message"]["content"] = parsed.content
            out["message"]["tool_calls"] = message_calls(parsed.calls)
            out["finish_reason"] = _finish(c.finish_reason, True)
        return out

    def stream_delta(self, d: Delta, offset: int, lps: list[TokenLogprob]) -> str:
        ts = self._streams.setdefault(d.index, ToolStream(self.parser))
        final = d.finish_reason is not None
        content, calls = ts.feed(d.text, final)
        if not (content or calls or final or lps or d.reasoning):
            return ""
        chunk = self.chunk(d, offset, lps)
        entry = chunk["choices"][0]
        delta: dict[str, Any] = {"reasoning_content": d.reasoning} if d.reasoning else {}
        if content:
            delta["content"] = content
        if calls:
            delta["tool_calls"] = calls
        entry["delta"] = delta
        entry["finish_reason"] = _finish(d.finish_reason, ts.called)
        return sse(chunk)
