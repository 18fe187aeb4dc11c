"""Reasoning text split from the answer per choice (`--reasoning-parser`: the formats and
their parser are common/reasoning_formats.py), and the chat template variables a request
sets (`template_kwargs`). Tool calls and structured outputs concern the content part only.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from common.reasoning_formats import ReasoningParser, new_parser
from frontend.errors import APIError
from frontend.request_handle import Delta


class ReasoningSplit:
    """A request's outputs with each choice's reasoning moved from `Delta.text` into
    `Delta.reasoning`. `Delta.num_reasoning_tokens` counts the output tokens up to the
    closing tag (the tags' tokens included; all of them while it is not closed)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.parsers: dict[int, ReasoningParser] = {}
        self.num_reasoning: dict[int, int] = {}

    def __call__(self, d: Delta) -> Delta:
        p = self.parsers.get(d.index)
        if p is None:
            p = self.parsers[d.index] = new_parser(self.name)
        reasoning, content = p.feed(d.text, d.finish_reason is not None)
        if p.touched:
            self.num_reasoning[d.index] = d.num_output_tokens
        return dataclasses.replace(
            d,
            text=content,
            reasoning=reasoning,
            num_reasoning_tokens=self.num_reasoning.get(d.index, 0),
        )


# chat template variables a request may not set (the conversation's own)
RESERVED_TEMPLATE_VARS = ("messages", "add_generation_prompt", "tools")


def template_kwargs(kwargs: dict[str, Any] | None, effort: str | None) -> dict[str, Any] | None:
    """A chat request's extra chat template variables: its `chat_template_kwargs`, and
    `reasoning_effort` as `enable_thinking` (false for none / minimal) unless those set it.
    A template that does not read `enable_thinking` ignores it."""
    out = dict(kwargs or {})
    for name in RESERVED_TEMPLATE_VARS:
        if name in out:
            raise APIError(
                400,
                f"chat_template_kwargs: {name!r} is the request's own, not settable",
                param="chat_template_kwargs",
            )
    if effort is not None:
        out.setdefault("enable_thinking", effort not in ("none", "minimal"))
    return out or None
