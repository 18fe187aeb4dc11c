"""The tool-calling fields of a chat request, checked at intake: `tools`, `tool_choice` and
`parallel_tool_calls` (the history's tool traces: frontend.chat_history); and what they
change in its SamplingParams (`apply_tools`), in the model's tool-call format.

    tools ─check_tools─▶ [{"type": "function", "function": {name, description, parameters}}]
    tool_choice ─▶ "none" | "auto" | "required" | a function's name
      none: tools in the prompt (as vLLM by default: the same prompt as auto, so the
            history's calls render the same), the text not parsed
      auto: tools in the prompt; calls parsed from the text (common.tool_formats)
      required / named: also forced by the format's grammar (ToolFormat.grammar): one
            call of the allowed functions, or with parallel_tool_calls (the default) one
            or more for "required"; a named function once (as vLLM's: left free to
            repeat it, the default model wrote the same call again until max_tokens)

Everything malformed is a 400 naming the field (`tools.0.function.name`), never a call the
engine cannot honour.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from common.sampling_params import SamplingParams
from common.schema_bounds import SchemaBoundError
from common.tool_formats import ToolFormat, tool_format
from frontend.errors import invalid
from frontend.tokenizer_calls import TokenizerCalls

MAX_TOOLS = 128
NAME_RE = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")  # OpenAI's rule for function names


@dataclass(frozen=True)
class ToolRequest:
    tools: list[dict[str, Any]]  # normalised, as chat templates take them
    choice: str  # "none" | "auto" | "required" | "named"
    name: str | None  # the function tool_choice names
    parallel: bool  # parallel_tool_calls (default true)

    @property
    def parsed(self) -> bool:
        """Whether calls are read from the text (all but "none")."""
        return self.choice != "none"

    @property
    def forced(self) -> bool:
        return self.choice in ("required", "named")

    def function(self, name: str) -> dict[str, Any]:
        return next(t["function"] for t in self.tools if t["function"]["name"] == name)

    @property
    def allowed(self) -> list[dict[str, Any]]:
        """The functions a forced call may use."""
        if self.name is not None:
            return [self.function(self.name)]
        return [t["function"] for t in self.tools]

    @property
    def repeat(self) -> bool:
        """Whether a forced reply may hold several calls."""
        return self.parallel and self.choice != "named"


def check_tools(tools: list[Any]) -> list[dict[str, Any]]:
    if len(tools) > MAX_TOOLS:
        raise invalid(f"tools: at most {MAX_TOOLS} tools, got {len(tools)}", "tools")
    out, seen = [], set()
    for i, tool in enumerate(tools):
        where = f"tools.{i}"
        if not isinstance(tool, dict):
            raise invalid(f"{where}: must be an object", where)
        if tool.get("type") != "function":
            raise invalid(f"{where}.type: only 'function' tools are supported", f"{where}.type")
        unknown = set(tool) - {"type", "function"}
        if unknown:
            raise invalid(f"{where}: unknown field {sorted(unknown)[0]!r}", where)
        fn = tool.get("function")
        if not isinstance(fn, dict):
            raise invalid(f"{where}.function: must be an object", f"{where}.function")
        name = fn.get("name")
        if not isinstance(name, str) or not NAME_RE.match(name):
            raise invalid(
                f"{where}.function.name: must be 1-64 characters of a-z, A-Z, 0-9, _, . or -",
                f"{where}.function.name",
            )
        if name in seen:
            raise invalid(
                f"{where}.function.name: duplicate name {name!r}", f"{where}.function.name"
            )
        seen.add(name)
        desc = fn.get("description")
        if desc is not None and not isinstance(desc, str):
            raise invalid(
                f"{where}.function.description: must be a string", f"{where}.function.description"
            )
        params = fn.get("parameters")
        if params is None:
            params = {"type": "object", "properties": {}}
        if not isinstance(params, dict):
            raise invalid(
                f"{where}.function.parameters: must be a JSON schema object",
                f"{where}.function.parameters",
            )
        check_schema(params, f"{where}.function.parameters")
        strict = fn.get("strict")
        if strict is not None and not isinstance(strict, bool):
            raise invalid(f"{where}.function.strict: must be a boolean", f"{where}.function.strict")
        entry: dict[str, Any] = {"name": name, "parameters": params}
        if desc is not None:
            entry["description"] = desc
        out.append({"type": "function", "function": entry})
    return out


def check_schema(schema: dict[str, Any], where: str) -> None:
    """A parameters schema must be a valid JSON schema whose instances are objects."""
    import jsonschema

    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as e:
        raise invalid(f"{where}: not a valid JSON schema: {e.message}", where) from None
    kind = schema.get("type")
    if kind is not None and kind != "object":
        raise invalid(
            f"{where}: the arguments must be an object (type 'object'), got {kind!r}", where
        )


def tool_request(
    tools: list[Any] | None, tool_choice: str | dict[str, Any] | None, parallel: bool | None
) -> ToolRequest | None:
    """The request's tool settings, or None when it has no tools."""
    checked = check_tools(tools) if tools else []
    names = {t["function"]["name"] for t in checked}
    name = None
    if tool_choice is None:
        choice = "auto" if checked else "none"
    elif isinstance(tool_choice, str):
        if tool_choice not in ("none", "auto", "required"):
            raise invalid(
                f"tool_choice: must be 'none', 'auto', 'required' or a function, got {tool_choice!r}",
                "tool_choice",
            )
        choice = tool_choice
    else:
        fn = tool_choice.get("function")
        if tool_choice.get("type") != "function" or not isinstance(fn, dict):
            raise invalid(
                'tool_choice: a named choice is {"type": "function", "function": {"name": ...}}',
                "tool_choice",
            )
        name = fn.get("name")
        if not isinstance(name, str):
            raise invalid(
                "tool_choice.function.name: must be a string", "tool_choice.function.name"
            )
        choice = "named"
    if choice != "none" and not checked:
        raise invalid(f"tool_choice: {choice!r} needs tools", "tool_choice")
    if name is not None and name not in names:
        raise invalid(
            f"tool_choice.function.name: no tool named {name!r} in tools",
            "tool_choice.function.name",
        )
    if not checked:
        return None
    return ToolRequest(checked, choice, name, True if parallel is None else parallel)


def apply_tools(
    params: list[SamplingParams], tools: ToolRequest, fmt: ToolFormat, client_skip: bool | None
) -> None:
    """Set what tools change in each choice's SamplingParams: the forcing grammar for
    "required" or a named function, and special tokens kept in the text when the format
    has some (unless the client set skip_special_tokens). A constraint the client asked
    for too (response_format / structured_outputs: `structured` already set) cannot be
    combined with a forced call."""
    for p in params:
        if fmt.needs_special_tokens and client_skip is None:
            p.skip_special_tokens = False
    if not tools.forced:
        return
    param = "tool_choice"
    if any(p.structured for p in params):
        raise invalid(f"{param}: a forced tool call cannot be combined with response_format", param)
    try:
        spec = fmt.grammar(tools.allowed, tools.repeat)
    except SchemaBoundError as e:
        raise invalid(f"tools: a function's parameters: {e}", "tools") from None
    for p in params:
        p.structured = {"kind": "grammar", "spec": spec}


class ServedToolFormat:
    """The tool-call format the tokenizer pool renders prompts in: the configured one,
    else its answer (tokenizer_info's tool_call_parser), asked once."""

    def __init__(self, configured: str | None, calls: TokenizerCalls) -> None:
        self.format = tool_format(configured) if configured else None
        self.calls = calls

    async def get(self) -> ToolFormat:
        if self.format is None:
            name = (await self.calls.call("tokenizer_info", {})).get("tool_call_parser")
            self.format = tool_format(name if isinstance(name, str) else "hermes")
        return self.format


async def chat_tools(
    tools: list[Any] | None,
    tool_choice: str | dict[str, Any] | None,
    parallel: bool | None,
    params: list[SamplingParams],
    skip_special_tokens: bool | None,
    served: ServedToolFormat,
) -> tuple[ToolRequest | None, ToolFormat | None]:
    """A chat request's tools checked and applied to its `params`: (the tools, or None;
    the format its text is parsed in, or None when it is not parsed)."""
    checked = tool_request(tools, tool_choice, parallel)
    if checked is None or not checked.parsed:
        return checked, None
    fmt = await served.get()
    apply_tools(params, checked, fmt, skip_special_tokens)
    return checked, fmt
