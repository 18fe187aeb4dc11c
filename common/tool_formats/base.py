"""What a tool-call format declares, once for the three sides that use it: the prompt (the
tokenizer worker), the parser and the forcing grammar (the frontend).

    layout        how calls are written:  OPEN (CALL_OPEN call CALL_CLOSE) SEP ... CLOSE
                  hermes:  "" ("<tool_call>\\n" {...} "\\n</tool_call>") "\\n" ... ""
    prompt        instructions(listing): the tool-use system prompt for a template that
                  knows no tools (INTRO, the tools, HOW_TO_CALL); write_call(fn): a past
                  call in the history
    parser        start / hold_back / calls over the model's text (below)
    grammar       call_rules(fn, k): one call of function fn as Lark rules `fn_<k>`;
                  grammar() wraps them in the layout (tool_choice required / named)

A parser reads a chat completion's text in two parts:

    "Let me check. <tool_call>{...}</tool_call>"
     └── content ─┘└──────── tool-call region ────────┘
                   ^ start(text): where the region begins (None: no call yet)

`calls(region, final)` lists the calls found in the region so far, each with its name
once the name is complete and the raw text of its arguments as written so far. While
the text is still growing (`final` False), a call's `arguments` only ever grows: what a
stream sent stays a prefix of what it will send (frontend.tools.stream relies on it).
With `final`, every call's arguments are a complete JSON object, or the call is dropped.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from common.schema_bounds import closed_objects


@dataclass
class PartialCall:
    name: str | None  # None until the name is complete
    arguments: str  # raw JSON text of the arguments so far (a complete object once done)
    done: bool = False  # the arguments are complete


@dataclass(frozen=True)
class ParsedCalls:
    content: str | None  # the text outside the calls; None when there is none
    calls: list[PartialCall]


def skip_ws(text: str, i: int) -> int:
    while i < len(text) and text[i] in " \t\r\n":
        i += 1
    return i


def marker_prefix_len(text: str, marker: str) -> int:
    """The length of the longest suffix of text that is a proper prefix of marker: text a
    stream must hold back, as it may be the start of the marker."""
    for k in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:k]):
            return k
    return 0


def dumps(x: Any) -> str:
    return json.dumps(x, ensure_ascii=False)


def lit(text: str) -> str:
    """A Lark string literal (JSON escapes are Lark's)."""
    return dumps(text)


INTRO = "You have access to the following functions:\n\n"  # most formats' prompts open so

# the arguments as json.dumps and the chat templates write them ({"a": 1, "b": [2, 3]}), no
# other whitespace: a small model left free to indent can do so until max_tokens
ARGS_JSON = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def schema_rule(schema: dict[str, Any], numbers: bool) -> str:
    """`%json` of a schema bounded as common.schema_bounds bounds one (closed objects;
    bounded numbers unless the parameters' "x-zeroserve" lifts them: split_options) and
    the whitespace of ARGS_JSON (llguidance's options, in the schema's "x-guidance")."""
    bounded = {"x-guidance": ARGS_JSON, **closed_objects(schema, numbers=numbers)}
    return "%json " + json.dumps(bounded, ensure_ascii=False, sort_keys=True)


class ToolFormat:
    """Base: a family's tool-call format. Subclasses set `name`, the layout and
    HOW_TO_CALL (or write `instructions`), `marker` or `lead` and `first`, and write
    `write_call`, `call_rules` and the parser's `calls`."""

    name = ""
    # whether the format uses special tokens the detokenizer must keep (skip_special_tokens)
    needs_special_tokens = False
    # the text that opens a region wherever it stands (hermes, mistral); else the output
    # is calls only when it begins with them (llama3_json, pythonic): after whitespace,
    # an optional special token `lead` and the character `first` a call begins with
    marker = ""
    lead, first = "", ""
    # the layout of several calls, for the prompt's history and the grammar alike
    OPEN, CLOSE, CALL_OPEN, CALL_CLOSE, SEP = "", "", "", "", ", "

    # the prompt's sentence on how to call, after INTRO and the tools' listing
    HOW_TO_CALL = ""

    # -- prompt ---------------------------------------------------------------------------
    def instructions(self, listing: str) -> str:
        """The system-prompt text that tells the model the tools (`listing`: one JSON
        object a line) and how to call them."""
        return f"{INTRO}{listing}\n\n{self.HOW_TO_CALL}"

    def write_call(self, fn: dict[str, Any]) -> str:
        """One past call {"name", "arguments"} as the model would have written it."""
        raise NotImplementedError

    def write_calls(self, calls: list[dict[str, Any]]) -> str:
        """An assistant message's tool_calls as the model would have written them."""
        fns = [c.get("function", {}) for c in calls]
        body = self.SEP.join(self.CALL_OPEN + self.write_call(f) + self.CALL_CLOSE for f in fns)
        return self.OPEN + body + self.CLOSE

    # -- parser ---------------------------------------------------------------------------
    def start(self, text: str) -> int | None:
        if self.marker:
            at = text.find(self.marker)
            return None if at < 0 else at
        i = skip_ws(text, 0)
        return i if text.startswith(self.lead, i) or text.startswith(self.first, i) else None

    def hold_back(self, text: str) -> int:
        """How much of a text without a region yet may still turn out to begin one."""
        if self.marker:
            return marker_prefix_len(text, self.marker)
        rest = text[skip_ws(text, 0) :]
        return len(text) if self.lead.startswith(rest) else 0  # all-blank text included

    def after_lead(self, region: str) -> int:
        """Where a region's calls begin: past whitespace and the optional `lead`."""
        i = skip_ws(region, 0)
        return skip_ws(region, i + len(self.lead)) if region.startswith(self.lead, i) else i

    def calls(self, region: str, final: bool) -> list[PartialCall]:
        raise NotImplementedError

    def parse(self, text: str) -> ParsedCalls:
        """A whole completion: its content and its complete calls. A region whose calls do
        not parse leaves the whole text as content."""
        at = self.start(text)
        if at is None:
            return ParsedCalls(text, [])
        calls = [c for c in self.calls(text[at:], final=True) if c.done and c.name]
        if not calls:
            return ParsedCalls(text, [])
        content = text[:at].strip()
        return ParsedCalls(content or None, calls)

    # -- grammar --------------------------------------------------------------------------
    def call_rules(self, fn: dict[str, Any], k: int) -> list[str]:
        """Lark rules whose `fn_<k>` is one call of `fn`, its arguments valid against its
        parameters schema."""
        raise NotImplementedError

    def grammar(self, fns: list[dict[str, Any]], repeat: bool) -> str:
        """llguidance's Lark grammar of a forced call of one of `fns` (one or more with
        `repeat`), in this layout, for SamplingParams.structured {"kind": "grammar"}."""
        rules = [rule for k, fn in enumerate(fns) for rule in self.call_rules(fn, k)]
        alternatives = " | ".join(f"fn_{k}" for k in range(len(fns)))
        if self.CALL_OPEN or self.CALL_CLOSE:
            alternatives = f"{lit(self.CALL_OPEN)} ({alternatives}) {lit(self.CALL_CLOSE)}"
        calls = "call" + (f" ({lit(self.SEP)} call)*" if repeat else "")
        top = " ".join(
            [
                *([lit(self.OPEN)] if self.OPEN else []),
                calls,
                *([lit(self.CLOSE)] if self.CLOSE else []),
            ]
        )
        return (
            "%llguidance {}\n"
            + "\n".join([f"start: {top}", f"call: {alternatives}", *rules])
            + "\n"
        )
