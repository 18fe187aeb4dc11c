"""Anthropic Messages bodies as pydantic models, translated into the chat request the
engine path serves (frontend.api.openai.OpenAIServing.chat_request):

    system (string | text blocks)          -> a "system" message first
    user: text blocks                      -> a "user" message (text joined)
    user: tool_result {tool_use_id, content}
                                           -> a "tool" message (tool_call_id), in place
    assistant: text + tool_use {id, name, input}
                                           -> an "assistant" message with tool_calls
    assistant: thinking, redacted_thinking -> dropped (the template never sees them)
    tools [{name, description, input_schema}] -> function tools (parameters: input_schema)
    tool_choice auto / any / tool {name} / none -> auto / required / named / none
    stop_sequences, temperature, top_p, top_k, max_tokens -> the chat fields
    output_config.format {"type": "json_schema", "schema"} -> response_format json_schema

Images, documents and server tools are a 400 naming the block. Like OpenAI's, the schema
is strict: a wrong JSON type or an unknown field is a 400 (as Anthropic's API does; but
not inside content blocks, see AnthropicContentBlock);
fields that change nothing here (`metadata`, `cache_control`, `thinking`, ...) are
accepted and ignored.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from frontend.api.openai_protocol import ChatCompletionRequest
from frontend.errors import invalid
from frontend.intake import STRICT, parse


class AnthropicContentBlock(BaseModel):
    """One content block; which fields a type needs is checked in `chat_messages`. Fields
    it does not know are ignored: clients send the blocks of a response back as they got
    them, with whatever fields their SDK's version has added (tool_use `caller`, ...)."""

    model_config = ConfigDict(extra="ignore", strict=True)
    type: str
    text: str | None = None  # text
    id: str | None = None  # tool_use
    name: str | None = None
    input: dict[str, Any] | None = None
    tool_use_id: str | None = None  # tool_result
    content: str | list[AnthropicContentBlock] | None = None
    is_error: bool | None = None
    cache_control: dict[str, Any] | None = (
        None  # prompt caching hints: the prefix cache is automatic
    )
    citations: list[Any] | None = None
    thinking: str | None = None  # thinking (history; dropped)
    signature: str | None = None
    data: str | None = None  # redacted_thinking
    source: Any = None  # image, document: refused, but parsed so the 400 says why
    title: str | None = None
    context: str | None = None


class AnthropicMessage(BaseModel):
    model_config = STRICT
    role: Literal["user", "assistant"]
    content: str | list[AnthropicContentBlock]


class AnthropicTool(BaseModel):
    model_config = STRICT
    name: str
    input_schema: dict[str, Any]
    description: str | None = None
    type: str | None = None  # "custom" (client tools) only
    cache_control: dict[str, Any] | None = None


class AnthropicToolChoice(BaseModel):
    model_config = STRICT
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class CountTokensRequest(BaseModel):
    """POST /v1/messages/count_tokens (and the prompt part of every Messages request)."""

    model_config = STRICT
    model: str
    messages: list[AnthropicMessage]
    system: str | list[AnthropicContentBlock] | None = None
    tools: list[AnthropicTool] | None = None
    tool_choice: AnthropicToolChoice | None = None
    thinking: dict[str, Any] | None = None  # accepted; the text is not split here
    cache_control: dict[str, Any] | None = None  # the prefix cache is automatic
    output_config: dict[str, Any] | None = None  # format: structured output; effort: ignored
    output_format: dict[str, Any] | None = None  # the older (beta) output_config.format


class MessagesRequest(CountTokensRequest):
    """POST /v1/messages."""

    max_tokens: int
    stop_sequences: list[str] | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    stream: bool | None = False
    metadata: dict[str, Any] | None = None  # user_id: accepted, not used
    service_tier: str | None = None
    container: Any = None
    context_management: dict[str, Any] | None = None
    mcp_servers: list[Any] | None = None


def chat_request(req: CountTokensRequest) -> ChatCompletionRequest:
    """The chat request `req` asks for; parsed like a chat body, so the engine path checks
    it (tools, sampling ranges, limits) exactly as it checks /v1/chat/completions."""
    messages = chat_messages(req)
    body: dict[str, Any] = {"model": req.model, "messages": messages}
    if _prefilled(messages):  # Anthropic's prefill: the reply continues that text
        body["continue_final_message"] = True
    if isinstance(req, MessagesRequest):
        if req.max_tokens < 1:
            raise invalid(f"max_tokens: must be at least 1, got {req.max_tokens}", "max_tokens")
        body["max_tokens"] = req.max_tokens
        body["stream"] = bool(req.stream)
        for name in ("temperature", "top_p", "top_k"):
            if (value := getattr(req, name)) is not None:
                body[name] = value
        if req.stop_sequences:
            body["stop"] = req.stop_sequences
    if (fmt := _output_format(req)) is not None:
        body["response_format"] = fmt
    if req.tools:
        body["tools"] = [_tool(i, t) for i, t in enumerate(req.tools)]
    choice = req.tool_choice
    if choice is not None and (req.tools or choice.type in ("any", "tool")):
        body["tool_choice"] = _tool_choice(choice)
        if choice.disable_parallel_tool_use:
            body["parallel_tool_calls"] = False
    return parse(ChatCompletionRequest, json.dumps(body).encode())


def _output_format(req: CountTokensRequest) -> dict[str, Any] | None:
    """output_config.format {"type": "json_schema", "schema"} as the chat response_format."""
    fmt = (req.output_config or {}).get("format") or req.output_format
    if fmt is None:
        return None
    if not (
        isinstance(fmt, dict)
        and fmt.get("type") == "json_schema"
        and isinstance(fmt.get("schema"), dict)
    ):
        raise invalid(
            'output_config.format: must be {"type": "json_schema", "schema": {...}}',
            "output_config.format",
        )
    return {"type": "json_schema", "json_schema": {"name": "output", "schema": fmt["schema"]}}


def _tool(i: int, tool: AnthropicTool) -> dict[str, Any]:
    if tool.type not in (None, "custom"):
        raise invalid(f"tools.{i}.type: server tools ({tool.type!r}) are not supported", "tools")
    fn: dict[str, Any] = {"name": tool.name, "parameters": tool.input_schema}
    if tool.description is not None:
        fn["description"] = tool.description
    return {"type": "function", "function": fn}


def _tool_choice(choice: AnthropicToolChoice) -> str | dict[str, Any]:
    if choice.type == "tool":
        if choice.name is None:
            raise invalid('tool_choice.name: required with type "tool"', "tool_choice.name")
        return {"type": "function", "function": {"name": choice.name}}
    return {"auto": "auto", "any": "required", "none": "none"}[choice.type]


def _prefilled(messages: list[dict[str, Any]]) -> bool:
    """The conversation ends with assistant text (no tool call) that the reply continues;
    a blank one is no prefill (Anthropic refuses trailing whitespace, we drop it)."""
    last = messages[-1] if messages else {}
    if last.get("role") != "assistant" or last.get("tool_calls"):
        return False
    if not str(last.get("content") or "").strip():
        messages.pop()  # nothing to continue: a new turn, as without it
        return False
    return True


def chat_messages(req: CountTokensRequest) -> list[dict[str, Any]]:
    """The conversation as chat messages (OpenAI's shapes, which the chat path reads)."""
    out: list[dict[str, Any]] = []
    if req.system is not None:
        system = req.system if isinstance(req.system, str) else _text(req.system, "system")
        out.append({"role": "system", "content": system})
    for i, m in enumerate(req.messages):
        if isinstance(m.content, str):
            out.append({"role": m.role, "content": m.content})
        elif m.role == "user":
            out.extend(_user(m.content, f"messages.{i}.content"))
        else:
            out.append(_assistant(m.content, f"messages.{i}.content"))
    return out


def _user(blocks: list[AnthropicContentBlock], where: str) -> list[dict[str, Any]]:
    """Tool results become tool messages; the text around them user messages, in order."""
    out: list[dict[str, Any]] = []
    texts: list[str] = []
    for j, b in enumerate(blocks):
        at = f"{where}.{j}"
        if b.type == "text":
            texts.append(_block_text(b, at))
        elif b.type == "tool_result":
            if texts:
                out.append({"role": "user", "content": "".join(texts)})
                texts = []
            if b.tool_use_id is None:
                raise invalid(f"{at}.tool_use_id: required in a tool_result block", at)
            content = b.content if isinstance(b.content, str) else _text(b.content or [], at)
            out.append({"role": "tool", "tool_call_id": b.tool_use_id, "content": content})
        else:
            raise _unsupported(b, at, "user")
    if texts or not out:
        out.append({"role": "user", "content": "".join(texts)})
    return out


def _assistant(blocks: list[AnthropicContentBlock], where: str) -> dict[str, Any]:
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    for j, b in enumerate(blocks):
        at = f"{where}.{j}"
        if b.type == "text":
            texts.append(_block_text(b, at))
        elif b.type == "tool_use":
            if b.id is None or b.name is None or b.input is None:
                raise invalid(f"{at}: a tool_use block needs id, name and input", at)
            arguments = json.dumps(b.input, ensure_ascii=False)
            calls.append(
                {
                    "id": b.id,
                    "type": "function",
                    "function": {"name": b.name, "arguments": arguments},
                }
            )
        elif b.type not in ("thinking", "redacted_thinking"):
            raise _unsupported(b, at, "assistant")
    msg: dict[str, Any] = {"role": "assistant", "content": "".join(texts)}
    if calls:
        msg["tool_calls"] = calls
    return msg


def _text(blocks: list[AnthropicContentBlock], where: str) -> str:
    """Text blocks joined (system prompts, tool results); any other block is a 400."""
    for j, b in enumerate(blocks):
        if b.type != "text":
            raise _unsupported(b, f"{where}.{j}", "text-only")
    return "".join(_block_text(b, f"{where}.{j}") for j, b in enumerate(blocks))


def _block_text(b: AnthropicContentBlock, at: str) -> str:
    if b.text is None:
        raise invalid(f"{at}.text: required in a text block", f"{at}.text")
    return b.text


def _unsupported(b: AnthropicContentBlock, at: str, where: str) -> Exception:
    if b.type in ("image", "document"):
        return invalid(f"{at}: {b.type} blocks are not supported by this server", at)
    return invalid(f"{at}: content block type {b.type!r} is not supported in {where} content", at)
