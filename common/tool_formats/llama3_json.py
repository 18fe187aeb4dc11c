"""Llama 3.1/3.2's JSON tool calls (its chat template's own format):

    {"name": "get_weather", "parameters": {"city": "Paris"}}
    <|python_tag|>{"name": ..., "parameters": ...}; {"name": ..., "parameters": ...}

The output is a call only when it begins with one (after optional whitespace or the
<|python_tag|> token); several calls are separated by ";".
"""

from __future__ import annotations

from common.tool_formats.json_calls import JsonCallsFormat, PartialCall


class Llama3JsonFormat(JsonCallsFormat):
    name = "llama3_json"
    needs_special_tokens = True  # <|python_tag|>
    ARGS_KEY, SEP = "parameters", "; "
    lead, first = "<|python_tag|>", "{"

    HOW_TO_CALL = (
        'To call a function, respond only with a JSON object {"name": <function-name>, '
        "\"parameters\": <args-json-object>}; separate several calls with ';'. Do not use "
        "variables."
    )

    def calls(self, region: str, final: bool) -> list[PartialCall]:
        return self.object_run(region, self.after_lead(region), ";")
