"""Reasoning text split from the answer (`--reasoning-parser`), as the text streams in.

A reasoning model writes its thoughts between `<think>` and `</think>`, then its answer:

    output:  "<think>" "Let me see" "</think>" "The answer is 4."
              └ tag ┘  └reasoning─┘ └─ tag ──┘ └──── content ────┘

The tags never reach the client. Parsers differ only in where reasoning may begin:

    qwen3, think   reasoning only when the output starts with `<think>` (leading
                   whitespace allowed); otherwise all of it is content
    deepseek_r1    the template may have opened `<think>` in the prompt, so everything
                   before the first `</think>` is reasoning, with or without an opening tag

States: START (undecided: the text so far may still be the opening tag) -> REASONING
(until `</think>`) -> CONTENT. The invariant: what `feed` returned so far, joined, is the
text with the tags taken out; a tail that may be the beginning of a tag is held back
until the next piece (or the final one) decides it, so a tag split across pieces is
still recognised. An output that ends inside the reasoning (no `</think>`) is all
reasoning. Tool calls and structured outputs concern the content part only.
"""

from __future__ import annotations

import dataclasses
from enum import Enum
from typing import Any

from frontend.errors import APIError
from frontend.request_handle import Delta

OPEN, CLOSE = "<think>", "</think>"


class State(Enum):
    START = 0
    REASONING = 1
    CONTENT = 2


def partial_tag(text: str, tag: str) -> int:
    """The length of the longest tail of `text` that is a proper prefix of `tag`."""
    for n in range(min(len(text), len(tag) - 1), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0


class ReasoningParser:
    """One choice's text, piece by piece, split into (reasoning, content)."""

    def __init__(self, implicit_open: bool) -> None:
        self.implicit_open = implicit_open  # deepseek_r1: reasoning before any tag
        self.state = State.START
        self.held = ""  # text not returned yet (it may be part of a tag)
        self.touched = False  # the last piece was (partly) reasoning, tags included

    def feed(self, text: str, final: bool) -> tuple[str, str]:
        """(reasoning, content) for the next piece; `final`: the last one."""
        buf = self.held + text
        self.held = ""
        reasoning = ""
        self.touched = self.state is State.REASONING
        if self.state is State.START:
            lead = buf.lstrip()
            if lead.startswith(OPEN):
                buf = lead[len(OPEN) :]
                self.state = State.REASONING
            elif OPEN.startswith(lead) and not final:
                self.held = buf  # maybe the opening tag, not complete yet
                return "", ""
            else:
                self.state = State.REASONING if self.implicit_open else State.CONTENT
        if self.state is State.REASONING:
            self.touched = True
            at = buf.find(CLOSE)
            if at < 0:
                hold = 0 if final else partial_tag(buf, CLOSE)
                self.held = buf[len(buf) - hold :]
                return buf[: len(buf) - hold], ""
            reasoning, buf = buf[:at], buf[at + len(CLOSE) :]
            self.state = State.CONTENT
        return reasoning, buf


def new_parser(name: str) -> ReasoningParser:
    """A parser named by --reasoning-parser (common.config.REASONING_PARSERS)."""
    return ReasoningParser(implicit_open=name == "deepseek_r1")


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
