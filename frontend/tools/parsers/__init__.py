"""Tool-call parsers, one file per model family's format, chosen by name
(`--tool-call-parser`) or by the model's architecture
(`tokenizer_worker.tool_prompt.default_tool_parser`)."""

from __future__ import annotations

from frontend.tools.parsers.base import ParsedCalls, PartialCall, ToolParser
from frontend.tools.parsers.hermes import HermesParser
from frontend.tools.parsers.llama3_json import Llama3JsonParser
from frontend.tools.parsers.mistral import MistralParser
from frontend.tools.parsers.pythonic import PythonicParser

PARSERS: dict[str, type[ToolParser]] = {
    p.name: p for p in (HermesParser, Llama3JsonParser, MistralParser, PythonicParser)
}

__all__ = ["PARSERS", "ParsedCalls", "PartialCall", "ToolParser", "get_parser"]


def get_parser(name: str) -> ToolParser:
    try:
        return PARSERS[name]()
    except KeyError:
        raise ValueError(f"unknown tool-call parser {name!r}; one of {sorted(PARSERS)}") from None
