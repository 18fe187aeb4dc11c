"""Llama 3.1/3.2's JSON tool calls (its chat template's own format):

    {"name": "get_weather", "parameters": {"city": "Paris"}}
    <|python_tag|>{"name": ..., "parameters": ...}; {"name": ..., "parameters": ...}

The output is a call only when it begins with one (after optional whitespace or the
<|python_tag|> token); several calls are separated by ";".
"""

from __future__ import annotations

from common.tool_formats.base import INTRO, skip_ws
from common.tool_formats.json_calls import JsonCallsFormat, PartialCall

TAG = "<|python_tag|>"


class Llama3JsonFormat(JsonCallsFormat):
    name = "llama3_json"
    needs_special_tokens = True  # <|python_tag|>
    ARGS_KEY, SEP = "parameters", "; "

    def instructions(self, listing: str) -> str:
        return (
            INTRO + f"{listing}\n\nTo call a function, respond only with a JSON object "
            '{"name": <function-name>, "parameters": <args-json-object>}; separate several '
            "calls with ';'. Do not use variables."
        )

    def start(self, text: str) -> int | None:
        i = skip_ws(text, 0)
        if text.startswith(TAG, i):
            return i
        if text.startswith("{", i):
            return i
        return None

    def hold_back(self, text: str) -> int:
        i = skip_ws(text, 0)
        rest = text[i:]
        return len(text) if TAG.startswith(rest) else 0  # all-blank text included

    def calls(self, region: str, final: bool) -> list[PartialCall]:
        i = skip_ws(region, 0)
        if region.startswith(TAG, i):
            i = skip_ws(region, i + len(TAG))
        return self.object_run(region, i, ";", final)
