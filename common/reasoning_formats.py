"""Reasoning formats (`--reasoning-parser`), their names and their parser: reasoning text
split from the answer as the text streams in (frontend.reasoning applies it per choice).

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

from enum import Enum

from common.tool_formats.base import marker_prefix_len  # a tag's start held back

OPEN, CLOSE = "<think>", "</think>"


class State(Enum):
    START = 0
    REASONING = 1
    CONTENT = 2


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
                hold = 0 if final else marker_prefix_len(buf, CLOSE)
                self.held = buf[len(buf) - hold :]
                return buf[: len(buf) - hold], ""
            reasoning, buf = buf[:at], buf[at + len(CLOSE) :]
            self.state = State.CONTENT
        return reasoning, buf


# name -> whether reasoning may begin without the opening tag (the template may have
# opened it in the prompt)
FORMATS: dict[str, bool] = {"deepseek_r1": True, "qwen3": False, "think": False}
REASONING_FORMAT_NAMES = tuple(FORMATS)


def new_parser(name: str) -> ReasoningParser:
    """A parser of the format named by --reasoning-parser."""
    try:
        return ReasoningParser(implicit_open=FORMATS[name])
    except KeyError:
        raise ValueError(f"unknown reasoning format {name!r}; one of {sorted(FORMATS)}") from None
