"""Hermes-style calls (NousResearch Hermes, Qwen 2/2.5/3, SmolLM2 with our tool prompt):

    text <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>
    <tool_call>{...}</tool_call>

Every call is one JSON object between the tags; content is the text before the first tag.
A missing closing tag at the end of the text is forgiven (a model may stop right after
the object).
"""

from __future__ import annotations

from frontend.tools.parsers.base import JsonCallsParser, PartialCall

OPEN, CLOSE = "<tool_call>", "</tool_call>"


class HermesParser(JsonCallsParser):
    name = "hermes"
    marker = OPEN

    def calls(self, region: str, final: bool) -> list[PartialCall]:
        out: list[PartialCall] = []
        parts = region.split(OPEN)[1:]
        for k, part in enumerate(parts):
            closed = CLOSE in part
            body = part.split(CLOSE, 1)[0]
            last = k == len(parts) - 1
            call = self.object_call(body, final or closed or not last)
            if call is None:
                if last and not final:
                    break  # still being written
                continue  # a malformed call: skipped
            out.append(call)
        return out
