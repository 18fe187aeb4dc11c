"""A chat prompt with tools: the model's own chat template when it handles tools, else a
tool-use system prompt in the model's tool-call format (the fallback in
docs/tool-calling.md, "The prompt").

    template source mentions `tools` ─▶ template.render(messages, tools=tools)
    otherwise (SmolLM2's template, for one) ─▶ fallback (also for a history with tool
    calls or results in a request without tools, minus the system prompt):
      system prompt  += the format's instructions (common.tool_formats), with the
                        tools' JSON, in the first system message or a new one
      assistant tool_calls ─▶ its content + the calls written in that format
      role "tool"          ─▶ a user message  <tool_response>\n{content}\n</tool_response>
                              (Qwen's and Hermes' convention), consecutive ones joined

The format is the configured one or the model family's (`family_tool_format`); the
tokenizer worker names it in tokenizer_info and the frontend parses with the same one.
"""

from __future__ import annotations

import json
from typing import Any

from common.families import family_of_config
from common.tool_formats import ToolFormat, tool_format
from tokenizer_worker.chat_template import ChatTemplate


def family_tool_format(hf: dict[str, Any], template: ChatTemplate | None) -> ToolFormat:
    """The model family's tool-call format (common/families: its tool_format, or that of
    a marker its template holds, as Llama 3.1's <|python_tag|>); hermes for a config of
    no family."""
    family = family_of_config(hf)
    if family is None:
        return tool_format("hermes")
    for marker, name in family.tool_format_markers:
        if template is not None and marker in template.source:
            return tool_format(name)
    return tool_format(family.tool_format)


def has_tool_traces(messages: list[dict[str, Any]]) -> bool:
    """Whether the history holds tool calls or results (rendered as tools are, even when
    the request sends no tools)."""
    return any(m.get("tool_calls") or m.get("role") == "tool" for m in messages)


def template_handles_tools(template: ChatTemplate) -> bool:
    return "tools" in template.source


def fallback_messages(
    messages: list[dict[str, Any]], tools: list[dict[str, Any]], fmt: ToolFormat
) -> list[dict[str, Any]]:
    """The conversation rewritten for a template that knows nothing of tools."""
    out: list[dict[str, Any]] = []
    for m in messages:
        role, content = m["role"], m.get("content") or ""
        if role == "assistant" and m.get("tool_calls"):
            calls = fmt.write_calls(m["tool_calls"])
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
    listing = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
    instructions = fmt.instructions(listing)
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
    fmt: ToolFormat,
    add_generation_prompt: bool = True,
    **extra: Any,
) -> str:
    if template_handles_tools(template):
        return template.render(messages, add_generation_prompt, tools=tools or None, **extra)
    return template.render(fallback_messages(messages, tools, fmt), add_generation_prompt, **extra)
