"""The grammar that forces a tool call, for tool_choice "required" or a named function:
llguidance's Lark dialect, handed to constrained decoding as SamplingParams.structured
{"kind": "grammar", "spec": <this text>}.

The grammar writes the calls in the format of the request's tool-call parser, so the
parser reads them back; each call's arguments are `%json{<the function's parameters
schema>}`, so they validate against it (its objects closed, the whitespace bounded: see
_schema). For "required", one call of any of the tools, or with parallel_tool_calls (the
default) one or more; for a named choice, one call of that function (as vLLM's: left free
to repeat it, the default model wrote the same call again until max_tokens):

    hermes        <tool_call>\n{"name": "f", "arguments": ARGS}\n</tool_call>  (\n-separated)
    llama3_json   {"name": "f", "parameters": ARGS}                              ("; ")
    mistral       [TOOL_CALLS] [{"name": "f", "arguments": ARGS}, ...]           (the token
                  spelt as text: a grammar cannot force a special token by its text)
    pythonic      [f(k=V, k2=V2, ), g()]  the schema's properties in order, each
                  `name=<JSON value>, ` (required ones always, the others optionally);
                  the parser reads JSON's true/false/null as Python literals
"""

from __future__ import annotations

import json
from typing import Any

from common.sampling_params import SamplingParams
from common.schema_bounds import SchemaBoundError, closed_objects, split_options
from frontend.errors import invalid
from frontend.tools.parsers import ToolParser
from frontend.tools.request import ToolRequest

HEADER = "%llguidance {}\n"


def _lit(text: str) -> str:
    """A Lark string literal (JSON escapes are Lark's)."""
    return json.dumps(text, ensure_ascii=False)


# the arguments as json.dumps and the chat templates write them ({"a": 1, "b": [2, 3]}), no
# other whitespace: a small model left free to indent can do so until max_tokens
ARGS_JSON = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def _schema(schema: dict[str, Any], numbers: bool) -> str:
    """`%json` of a schema bounded as common.schema_bounds bounds one (closed objects;
    bounded numbers unless the parameters' "x-zeroserve" lifts them) and the whitespace
    of ARGS_JSON (llguidance's options, in the schema's "x-guidance")."""
    schema = {"x-guidance": ARGS_JSON, **closed_objects(schema, numbers=numbers)}
    return "%json " + json.dumps(schema, ensure_ascii=False, sort_keys=True)


def _json_call(fn: dict[str, Any], args_key: str, k: int) -> list[str]:
    head = '{"name": ' + json.dumps(fn["name"], ensure_ascii=False) + f', "{args_key}": '
    params, numbers = split_options(fn["parameters"])
    return [f"fn_{k}: {_lit(head)} args_{k} {_lit('}')}", f"args_{k}: {_schema(params, numbers)}"]


def _pythonic_call(fn: dict[str, Any], k: int) -> list[str]:
    params, numbers = split_options(fn["parameters"])
    props: dict[str, Any] = params.get("properties") or {}
    required = set(params.get("required") or ())
    items, rules = [], []
    for j, (key, sub) in enumerate(props.items()):
        rules.append(f"v_{k}_{j}: {_schema(sub if isinstance(sub, dict) else {}, numbers)}")
        item = f"{_lit(key + '=')} v_{k}_{j} {_lit(', ')}"
        items.append(item if key in required else f"({item})?")
    body = " ".join(items)
    return [f"fn_{k}: {_lit(fn['name'] + '(')} {body} {_lit(')')}", *rules]


def tool_grammar(tools: ToolRequest, parser: str) -> str:
    """The Lark grammar of a forced call for `parser`'s format; ValueError for a parser
    with no grammar."""
    fns = tools.allowed
    rules: list[str] = []
    for k, fn in enumerate(fns):
        if parser == "hermes" or parser == "mistral":
            rules += _json_call(fn, "arguments", k)
        elif parser == "llama3_json":
            rules += _json_call(fn, "parameters", k)
        elif parser == "pythonic":
            rules += _pythonic_call(fn, k)
        else:
            raise ValueError(f"no tool-call grammar for parser {parser!r}")
    alternatives = " | ".join(f"fn_{k}" for k in range(len(fns)))
    repeat = tools.parallel and tools.choice != "named"
    if parser == "hermes":
        call = f"call: {_lit('<tool_call>' + chr(10))} ({alternatives}) {_lit(chr(10) + '</tool_call>')}"
        sep = _lit("\n")
        top = "start: call" + (f" ({sep} call)*" if repeat else "")
    else:
        call = f"call: {alternatives}"
        sep = _lit("; " if parser == "llama3_json" else ", ")
        calls = "call" + (f" ({sep} call)*" if repeat else "")
        if parser == "llama3_json":
            top = f"start: {calls}"
        elif parser == "mistral":
            top = f"start: {_lit('[TOOL_CALLS] [')} {calls} {_lit(']')}"
        else:
            top = f"start: {_lit('[')} {calls} {_lit(']')}"
    return HEADER + "\n".join([top, call, *rules]) + "\n"


def structured_supported() -> bool:
    """Whether this build's SamplingParams carries a grammar (constrained decoding)."""
    from dataclasses import fields

    return any(f.name == "structured" for f in fields(SamplingParams))


def apply_tools(
    params: list[SamplingParams], tools: ToolRequest, parser: ToolParser, client_skip: bool | None
) -> None:
    """Set what tools change in each choice's SamplingParams: the forcing grammar for
    "required" or a named function, and special tokens kept in the text when the format
    has some (unless the client set skip_special_tokens). A constraint the client asked
    for too (response_format / structured_outputs: `structured` already set) cannot be
    combined with a forced call."""
    for p in params:
        if parser.needs_special_tokens and client_skip is None:
            p.skip_special_tokens = False
    if not tools.forced:
        return
    param = "tool_choice"
    if any(p.structured for p in params):
        raise invalid(f"{param}: a forced tool call cannot be combined with response_format", param)
    if not structured_supported():
        raise invalid(
            f"{param}: {tools.choice!r} needs constrained decoding, which this build lacks", param
        )
    try:
        spec = tool_grammar(tools, parser.name)
    except SchemaBoundError as e:
        raise invalid(f"tools: a function's parameters: {e}", "tools") from None
    for p in params:
        p.structured = {"kind": "grammar", "spec": spec}
