"""Tool-call formats, one file each: how a model is told its tools, how its calls are read
back from its text, and the grammar that forces a call (base.py says what a format
declares). The tokenizer worker renders prompts in a format and names it in
tokenizer_info; the frontend parses and forces calls in the same one, so they agree.

    base.py        ToolFormat; PartialCall, ParsedCalls; the grammar's JSON-schema rule
    json_calls.py  the formats whose calls are JSON objects, and their JSON scanner
    hermes.py  llama3_json.py  mistral.py  pythonic.py

A model family names its format (common/families: tool_format); `--tool-call-parser`
names one for every model. A new format: its file here and its line in FORMATS.
"""

from __future__ import annotations

from common.tool_formats.base import ParsedCalls, PartialCall, ToolFormat
from common.tool_formats.hermes import HermesFormat
from common.tool_formats.llama3_json import Llama3JsonFormat
from common.tool_formats.mistral import MistralFormat
from common.tool_formats.pythonic import PythonicFormat

FORMATS: dict[str, ToolFormat] = {
    f.name: f for f in (HermesFormat(), Llama3JsonFormat(), MistralFormat(), PythonicFormat())
}
TOOL_FORMAT_NAMES = tuple(FORMATS)

__all__ = [
    "FORMATS",
    "TOOL_FORMAT_NAMES",
    "ParsedCalls",
    "PartialCall",
    "ToolFormat",
    "tool_format",
]


def tool_format(name: str) -> ToolFormat:
    try:
        return FORMATS[name]
    except KeyError:
        raise ValueError(f"unknown tool-call format {name!r}; one of {sorted(FORMATS)}") from None
