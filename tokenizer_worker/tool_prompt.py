"""A chat prompt with tools: the model's own chat template when it handles tools, else a
tool-use system prompt in the family's format (the fallback in docs/tool-calling.md, "The
prompt").

    template source mentions `tools` ─▶ template.render(messages, tools=tools)
    otherwise (SmolLM2's template, for one) ─▶ fallback (also for a history with tool
    calls or results in a request without tools, minus the system prompt):
      system prompt  += the tool instructions of the parser's format (below), with the
                        tools' JSON, in the first system message or a new one
      assistant tool_calls ─▶ its content + the calls written in that format
      role "tool"          ─▶ a user message  <tool_response>\n{content}\n</tool_response>
                              (Qwen's and Hermes' convention), consecutive ones joined

The tool-call parser (hence the format) is the configured one or the architecture's
default (`default_tool_parser`); the frontend reads the same answer from tokenizer_info,
so the prompt and the parser always agree.
"""

from __future__ import annotations

import json
from typing import Any

from common.families import family_of_config
from tokenizer_worker.chat_template import ChatTemplate


def default_tool_parser(hf: dict[str, Any], template: ChatTemplate | None) -> str:
    """The model family's tool-call format (common/families: its tool_format, or that of
    a marker its template holds, as Llama 3.1's <|python_tag|>); hermes for a config of
    no family."""
    family = family_of_config(hf)
    if family is None:
        return "hermes"
    for marker, fmt in family.tool_format_markers:
        if template is not None and marker in template.source:
            return fmt
    return family.tool_format


def has_tool_traces(messages: list[dict[str, Any]]) -> bool:
    """Whether the history holds tool calls or results (rendered as tools are, even when
    the request sends no tools)."""
    return any(m.get("tool_calls") or m.get("role") == "tool" for m in messages)


def template_handles_tools(template: ChatTemplate) -> bool:
    return "tools" in template.source


def _dumps(x: Any) -> str:
    return json.dumps(x, ensure_ascii=False)


def _args_text(args: Any) -> str:
    return args if isinstance(args, str) else _dumps(args)


_INTRO = "You have access to the following functions:\n\n"


def tool_instructions(tools: list[dict[str, Any]], parser: str) -> str:
    """The system-prompt text that tells the model the tools and the call format."""
    listing = "\n".join(_dumps(t) for t in tools)
    if parser == "hermes":
        return (
            "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
            "You are provided with function signatures within <tools></tools> XML tags:\n"
            f"<tools>\n{listing}\n</tools>\n\n"
            "For each function call, return a json object with function name and arguments "
            "within <tool_call></tool_call> XML tags:\n<tool_call>\n"
            '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
        )
    if parser == "llama3_json":
        return (
            _INTRO + f"{listing}\n\nTo call a function, respond only with a JSON object "
            '{"name": <function-name>, "parameters": <args-json-object>}; separate several '
            "calls with ';'. Do not use variables."
        )
    if parser == "mistral":
        return (
            _INTRO + f"{listing}\n\nTo call functions, respond only with [TOOL_CALLS] followed "
            'by a JSON list of calls: [TOOL_CALLS] [{"name": <function-name>, "arguments": '
            "<args-json-object>}]"
        )
    if parser == "pythonic":
        return (
            _INTRO + f"{listing}\n\nTo call functions, respond only with a Python list of "
            "calls with keyword arguments: [func_name1(param1=value1, param2=value2), "
            "func_name2(param=value)]"
        )
    raise ValueError(f"no tool prompt for parser {parser!r}")


def write_calls(calls: list[dict[str, Any]], parser: str) -> str:
    """Assistant tool calls written as the model would have written them."""
    fns = [c.get("function", {}) for c in calls]
    if parser == "hermes":
        return "\n".join(
            f'<tool_call>\n{{"name": {_dumps(f.get("name"))}, "arguments": '
            f"{_args_text(f.get('arguments', {}))}}}\n</tool_call>"
            for f in fns
        )
    if parser == "llama3_json":
        return "; ".join(
            f'{{"name": {_dumps(f.get("name"))}, "parameters": {_args_text(f.get("arguments", {}))}}}'
            for f in fns
        )
    if parser == "mistral":
        items = ", ".join(
            f'{{"name": {_dumps(f.get("name"))}, "arguments": {_args_text(f.get("arguments", {}))}}}'
            for f in fns
        )
        return f"[TOOL_CALLS] [{items}]"
    parts = []
    for f in fns:
        args = f.get("arguments", {})
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except ValueError:
                args = {}
        kw = ", ".join(
            f"{k}={_dumps(v)}" for k, v in (args.items() if isinstance(args, dict) else ())
        )
        parts.append(f"{f.get('name')}({kw})")
    return "[" + ", ".join(parts) + "]"


def fallback_messages(
    messages: list[dict[str, Any]], tools: list[dict[str, Any]], parser: str
) -> list[dict[str, Any]]:
    """The conversation rewritten for a template that knows nothing of tools."""
    out: list[dict[str, Any]] = []
    for m in messages:
        role, content = m["role"], m.get("content") or ""
        if role == "assistant" and m.get("tool_calls"):
            calls = write_calls(m["tool_calls"], parser)
            out.append(
                {"role": "assistant", "content": f"{content}\n{calls}" if content else calls}
            )
        elif role == "tool":
            block = f"<tool_response>\n{content}\n</tool_response>"
            prev = out[-1] if out else None
            if prev is not None and prev.get("_tool"):
                prev["content"] += "\n" + block
            else:
                out.append({"role": "user", "content": block, "_tool": True})
        else:
            out.append({k: v for k, v in m.items() if k in ("role", "content", "name")})
    for m in out:
        m.pop("_tool", None)
    if not tools:  # only the history's traces to rewrite
        return out
    instructions = tool_instructions(tools, parser)
    if out and out[0]["role"] in ("system", "developer"):
        first = out[0]
        out[0] = {**first, "content": f"{first['content']}\n\n{instructions}".lstrip()}
    else:
        out.insert(0, {"role": "system", "content": instructions})
    return out


def render_with_tools(
    template: ChatTemplate,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]],
    parser: str,
    add_generation_prompt: bool = True,
    **extra: Any,
) -> str:
    if template_handles_tools(template):
        return template.render(messages, add_generation_prompt, tools=tools or None, **extra)
    return template.render(
        fallback_messages(messages, tools, parser), add_generation_prompt, **extra
    )
