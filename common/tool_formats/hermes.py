"""Hermes-style calls (NousResearch Hermes, Qwen 2/2.5/3, SmolLM2 with our tool prompt):

    text <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>
    <tool_call>{...}</tool_call>

Every call is one JSON object between the tags; content is the text before the first tag.
A missing closing tag at the end of the text is forgiven (a model may stop right after
the object). Tool results go back as <tool_response> blocks (tokenizer_worker.tool_prompt).
"""

from __future__ import annotations

from common.tool_formats.json_calls import JsonCallsFormat, PartialCall

OPEN, CLOSE = "<tool_call>", "</tool_call>"


class HermesFormat(JsonCallsFormat):
    name = "hermes"
    marker = OPEN
    CALL_OPEN, CALL_CLOSE, SEP = OPEN + "\n", "\n" + CLOSE, "\n"

    def instructions(self, listing: str) -> str:
        return (
            "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
            "You are provided with function signatures within <tools></tools> XML tags:\n"
            f"<tools>\n{listing}\n</tools>\n\n"
            "For each function call, return a json object with function name and arguments "
            "within <tool_call></tool_call> XML tags:\n<tool_call>\n"
            '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
        )

    def calls(self, region: str, final: bool) -> list[PartialCall]:
        out: list[PartialCall] = []
        parts = region.split(OPEN)[1:]
        for k, part in enumerate(parts):
            closed = CLOSE in part
            body = part.split(CLOSE, 1)[0]
            last = k == len(parts) - 1
            call = self.object_call(body)
            if call is None:  # no name: malformed, or (the last) still being written
                if last and not final and not closed:
                    break  # still being written
                continue  # a malformed call: skipped
            out.append(call)
        return out
