"""Mistral's tool calls: the [TOOL_CALLS] token followed by a JSON array of calls,

    [TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}, {...}]

or (tokenizer v11 and later) one `name[ARGS]{...}` per call:

    [TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]other[ARGS]{}

[TOOL_CALLS] is a special token, so requests with tools keep special tokens in the text;
prompts and grammars write the array form (a grammar spells the token as text: it cannot
force a special token by its text).
"""

from __future__ import annotations

from common.tool_formats.base import skip_ws
from common.tool_formats.json_calls import JsonCallsFormat, PartialCall, json_object, scan_json

MARK, ARGS = "[TOOL_CALLS]", "[ARGS]"


class MistralFormat(JsonCallsFormat):
    name = "mistral"
    needs_special_tokens = True
    marker = MARK
    OPEN, CLOSE = MARK + " [", "]"

    HOW_TO_CALL = (
        "To call functions, respond only with [TOOL_CALLS] followed by a JSON list of calls: "
        '[TOOL_CALLS] [{"name": <function-name>, "arguments": <args-json-object>}]'
    )

    def calls(self, region: str, final: bool) -> list[PartialCall]:
        body = region[len(MARK) :]
        i = skip_ws(body, 0)
        if i < len(body) and body[i] == "[":
            return self.object_run(body, skip_ws(body, i + 1), ",")
        if i >= len(body):
            return []
        return self._named(region, final)

    def _named(self, region: str, final: bool) -> list[PartialCall]:
        out: list[PartialCall] = []
        parts = region.split(MARK)[1:]
        for k, part in enumerate(parts):
            if ARGS not in part:
                break  # the name is still being written
            name, args = part.split(ARGS, 1)
            name, args = name.strip(), args.strip()
            end = scan_json(args, 0) if args else None
            done = end is not None
            if done:
                args = args[:end]
            if not done:
                if not final and k == len(parts) - 1:
                    out.append(PartialCall(name, args, False))
                break
            # a malformed one stays in its place, not done (parse drops it; a stream's
            # later calls keep their indexes)
            out.append(PartialCall(name, args, json_object(args) is not None))
        return out
