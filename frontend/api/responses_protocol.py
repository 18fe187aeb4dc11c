"""The Responses API's request body (pydantic, so /openapi.json describes it), its checks,
and its translation into the chat request the engine path serves
(frontend.api.openai.OpenAIServing.chat_request).

Input items become chat messages: a message item its role and joined text, consecutive
function_call items one assistant message's tool_calls, a function_call_output a tool
message; `instructions` a system message first. Function tools become chat tools,
text.format chat's response_format, max_output_tokens max_completion_tokens. Errors the
chat path raises name the Responses fields (`rename`).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, ValidationError

from frontend.api.openai_protocol import ChatCompletionRequest
from frontend.errors import APIError, invalid
from frontend.intake import STRICT

TEXT_PARTS = ("input_text", "output_text")


class ContentPart(BaseModel):
    model_config = STRICT
    type: str  # input_text / output_text; images, files and audio are refused (400)
    text: str | None = None
    annotations: list[Any] | None = None
    logprobs: list[Any] | None = None
    image_url: str | None = None
    file_id: str | None = None
    file_data: str | None = None
    file_url: str | None = None
    filename: str | None = None
    detail: str | None = None
    refusal: str | None = None


class MessageItem(BaseModel):
    model_config = STRICT
    type: Literal["message"] | None = None
    role: Literal["user", "system", "developer", "assistant"]
    content: str | list[ContentPart]
    id: str | None = None
    status: str | None = None


class FunctionCallItem(BaseModel):
    model_config = STRICT
    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str
    id: str | None = None
    status: str | None = None


class FunctionCallOutputItem(BaseModel):
    model_config = STRICT
    type: Literal["function_call_output"]
    call_id: str
    output: str | list[ContentPart]
    id: str | None = None
    status: str | None = None


class OtherItem(BaseModel):
    """Any other item type (reasoning, item_reference, hosted tools' calls): a 400."""

    model_config = ConfigDict(extra="allow", strict=True)
    type: str


def _item_kind(value: Any) -> str | None:
    if isinstance(value, BaseModel):
        value = value.model_dump()
    if not isinstance(value, dict):
        return None
    kind = value.get("type", "message")
    return kind if kind in ("message", "function_call", "function_call_output") else "other"


InputItem = Annotated[
    Annotated[MessageItem, Tag("message")]
    | Annotated[FunctionCallItem, Tag("function_call")]
    | Annotated[FunctionCallOutputItem, Tag("function_call_output")]
    | Annotated[OtherItem, Tag("other")],
    Discriminator(_item_kind),
]


class FunctionTool(BaseModel):
    """{"type": "function", "name", "description", "parameters", "strict"}; other tool
    types (web_search, file_search, ...) parse so that the 400 can say what they are."""

    model_config = ConfigDict(extra="allow", strict=True)
    type: str
    name: str | None = None
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class TextFormat(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)
    type: Literal["text", "json_schema", "json_object"]
    name: str | None = None
    description: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


class TextConfig(BaseModel):
    model_config = STRICT
    format: TextFormat | None = None
    verbosity: Literal["low", "medium", "high"] | None = None


class ResponsesRequest(BaseModel):
    model_config = STRICT
    model: str | None = None
    input: str | list[InputItem]
    instructions: str | None = None
    previous_response_id: str | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    stream: bool | None = False
    stream_options: dict[str, Any] | None = None
    store: bool | None = True
    metadata: dict[str, str] | None = None
    user: str | None = None
    # accepted, changing nothing here (or refused unless their value asks for nothing)
    include: list[str] | None = None
    truncation: Literal["auto", "disabled"] | None = None
    service_tier: str | None = None
    prompt_cache_key: str | None = None
    prompt_cache_retention: str | None = None
    safety_identifier: str | None = None
    reasoning: dict[str, Any] | None = None
    background: bool | None = None
    top_logprobs: int | None = None
    max_tool_calls: int | None = None


def check_unsupported(req: ResponsesRequest) -> None:
    off: dict[str, Callable[[Any], bool]] = {  # field -> "this value asks for nothing"
        "background": lambda v: v is False,
        "top_logprobs": lambda v: v == 0,
        "max_tool_calls": lambda v: False,
        "reasoning": lambda v: not any(x is not None for x in v.values()),
        "stream_options": lambda v: bool(req.stream) and set(v) <= {"include_obfuscation"},
    }
    for name, harmless in off.items():
        value = getattr(req, name)
        if value is not None and not harmless(value):
            raise invalid(f"{name}: not supported by this server", name)


def input_items(req: ResponsesRequest) -> list[dict[str, Any]]:
    """The request's input as item dicts (a string is one user message); refuses the
    item and content types the server does not serve."""
    if isinstance(req.input, str):
        return [{"type": "message", "role": "user", "content": req.input}]
    if not req.input:
        raise invalid("input must not be empty", "input")
    out = []
    for i, item in enumerate(req.input):
        if isinstance(item, OtherItem):
            raise invalid(
                f"input.{i}.type: {item.type!r} items are not supported", f"input.{i}.type"
            )
        parts = getattr(item, "content", None) or getattr(item, "output", None)
        for j, part in enumerate(parts if isinstance(parts, list) else ()):
            if part.type not in TEXT_PARTS:
                where = f"input.{i}.{'content' if isinstance(item, MessageItem) else 'output'}.{j}"
                raise invalid(f"{where}: content type {part.type!r} is not supported", where)
        out.append({"type": "message", **item.model_dump(exclude_none=True)})
    return out


def _text(content: str | list[dict[str, Any]]) -> str:
    if isinstance(content, str):
        return content
    return "".join(p.get("text") or "" for p in content)


def chat_messages(items: list[dict[str, Any]], instructions: str | None) -> list[dict[str, Any]]:
    """Items (checked: input_items, or output the server made) as chat messages; consecutive
    function calls become one assistant message's tool_calls."""
    messages: list[dict[str, Any]] = []
    if instructions:
        messages.append({"role": "system", "content": instructions})
    for item in items:
        kind = item.get("type", "message")
        if kind == "message":
            messages.append({"role": item["role"], "content": _text(item["content"])})
        elif kind == "function_call":
            call = {
                "id": item["call_id"],
                "type": "function",
                "function": {"name": item["name"], "arguments": item["arguments"]},
            }
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "reasoning":  # a previous response's reasoning: not shown again
            continue
        else:  # function_call_output
            content = _text(item["output"])
            messages.append({"role": "tool", "tool_call_id": item["call_id"], "content": content})
    return messages


def chat_tools(req: ResponsesRequest) -> tuple[list[dict[str, Any]] | None, Any]:
    """(chat's tools, chat's tool_choice)."""
    tools = None
    if req.tools is not None:
        tools = []
        for i, t in enumerate(req.tools):
            if t.type != "function":
                where = f"tools.{i}.type"
                raise invalid(f"{where}: only function tools are served, got {t.type!r}", where)
            if t.model_extra:
                param = f"tools.{i}.{next(iter(t.model_extra))}"
                raise invalid(f"Unrecognized request argument supplied: {param}", param)
            fn = t.model_dump(exclude_none=True, exclude={"type"})
            tools.append({"type": "function", "function": fn})
    choice: Any = req.tool_choice
    if isinstance(choice, dict):
        if choice.get("type") != "function" or set(choice) != {"type", "name"}:
            raise invalid(
                'tool_choice: a named choice is {"type": "function", "name": ...}', "tool_choice"
            )
        choice = {"type": "function", "function": {"name": choice["name"]}}
    return tools, choice


def response_format(req: ResponsesRequest) -> dict[str, Any] | None:
    fmt = req.text.format if req.text is not None else None
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return {"type": "json_object"}
    if fmt.name is None or fmt.schema_ is None:
        raise invalid("text.format: json_schema needs name and schema", "text.format")
    spec = fmt.model_dump(exclude_none=True, by_alias=True, exclude={"type"})
    return {"type": "json_schema", "json_schema": spec}


def chat_request_of(req: ResponsesRequest, items: list[dict[str, Any]]) -> ChatCompletionRequest:
    tools, choice = chat_tools(req)
    body: dict[str, Any] = {
        "model": req.model,
        "messages": chat_messages(items, req.instructions),
        "max_completion_tokens": req.max_output_tokens,
        "temperature": req.temperature,
        "top_p": req.top_p,
        "tools": tools,
        "tool_choice": choice,
        "parallel_tool_calls": req.parallel_tool_calls,
        "response_format": response_format(req),
        "user": req.user,
        "stream": bool(req.stream),
        "stream_options": {"include_usage": True} if req.stream else None,
    }
    try:
        return ChatCompletionRequest.model_validate(body)
    except ValidationError as e:  # only what the checks above let through
        raise invalid(f"input: {e.errors(include_url=False)[0]['msg']}", "input") from None


# chat's parameter names -> the Responses fields they came from (longest prefix first)
RENAMES = (
    (r"^messages(\..*)?$", "input"),
    (r"^max_(completion_)?tokens$", "max_output_tokens"),
    (r"^response_format\.json_schema", "text.format"),
    (r"^response_format", "text.format"),
    (r"^structured", "text.format"),
    (r"^tools\.(\d+)\.function", r"tools.\1"),
    (r"^tool_choice\.function", "tool_choice"),
)


def rename(err: APIError) -> APIError:
    """`err` naming the Responses fields instead of the chat fields it was raised for."""
    if err.param is None:
        return err
    for pattern, repl in RENAMES:
        param = re.sub(pattern, repl, err.param)
        if param != err.param:
            message = err.message.replace(err.param, param)
            message = re.sub(r"\bmax_(completion_)?tokens\b", "max_output_tokens", message)
            return APIError(err.status, message, err.type, param, err.code, err.headers)
    return err
