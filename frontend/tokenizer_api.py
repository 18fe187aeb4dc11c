"""The tokenizer endpoints, in vLLM's shapes, served by the tokenizer pool:

    POST /tokenize        {"prompt"} or {"messages"} (chat template applied),
                          "add_special_tokens" (default: true for a prompt, false for
                          messages, whose template holds them), "add_generation_prompt"
                          (messages; default true), "return_token_strs"
                          -> {"count", "max_model_len", "tokens", "token_strs"}
    POST /detokenize      {"tokens"} -> {"prompt"}  (special tokens kept, as vLLM)
    GET  /tokenizer_info  the tokenizer's config: tokenizer_class, special tokens,
                          model_max_length, chat_template, max_model_len, vocab_size

Behind the same API key as /v1/*. The bodies are checked here (strict JSON types, 400
naming the field); the worker checks what needs the tokenizer (ids outside the
vocabulary, a template that refuses the messages) and answers (frontend.tokenizer_calls).
"""

from __future__ import annotations

from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from common.messages.base import INT32_MAX
from frontend.api.openai_protocol import ChatMessage
from frontend.chat_history import chat_messages
from frontend.cluster.engine_client import EngineClient
from frontend.errors import invalid, unavailable
from frontend.intake import STRICT
from frontend.room import Room


class TokenizeBody(BaseModel):
    model_config = STRICT
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool | None = None
    add_generation_prompt: bool | None = None
    continue_final_message: bool | None = None
    return_token_strs: bool | None = None


class DetokenizeBody(BaseModel):
    model_config = STRICT
    model: str | None = None
    tokens: list[int]


def tokenize_args(body: TokenizeBody) -> dict[str, Any]:
    if (body.prompt is None) == (body.messages is None):
        raise invalid("give exactly one of prompt and messages", "prompt")
    args: dict[str, Any] = {"return_token_strs": bool(body.return_token_strs)}
    if body.messages is not None:
        args["messages"] = chat_messages(body.messages)
        args["add_generation_prompt"] = body.add_generation_prompt is not False
        if body.continue_final_message:
            args["continue_final_message"] = True
        args["add_special_tokens"] = bool(body.add_special_tokens)
    else:
        for name in ("add_generation_prompt", "continue_final_message"):
            if getattr(body, name) is not None:
                raise invalid(f"{name}: only with messages", name)
        args["prompt"] = body.prompt
        args["add_special_tokens"] = body.add_special_tokens is not False
    return args


async def call_tokenizer(client: EngineClient, op: str, args: dict[str, Any]) -> dict[str, Any]:
    """The tokenizer pool's answer to one call; 503 while the server drains or before a
    tokenizer worker is up (every route that asks the pool: these, Anthropic's
    count_tokens)."""
    if client.draining:
        raise unavailable("server is shutting down", "shutting_down")
    if "tokenizer" in client.cluster.missing():
        raise unavailable("server not ready: waiting for tokenizer", "not_ready")
    return await client.tokenizer_calls.call(op, args)


def add_tokenizer_routes(room: Room) -> None:
    """The three routes, answered by the tokenizer pool."""

    async def call(op: str, args: dict[str, Any]) -> JSONResponse:
        return JSONResponse(await call_tokenizer(room.client, op, args))

    async def tokenize(request: Request) -> JSONResponse:
        body, _ = await room.intake.read(request, TokenizeBody)
        return await call("tokenize", tokenize_args(body))

    async def detokenize(request: Request) -> JSONResponse:
        body, _ = await room.intake.read(request, DetokenizeBody)
        bad = [t for t in body.tokens if not 0 <= t <= INT32_MAX]  # no vocabulary is larger
        if bad:
            raise invalid(f"tokens: token ids {bad[:4]} are outside the vocabulary", "tokens")
        return await call("detokenize", {"tokens": body.tokens})

    room.post("/tokenize", tokenize, TokenizeBody)
    room.post("/detokenize", detokenize, DetokenizeBody)

    @room.api.get("/tokenizer_info")
    async def tokenizer_info() -> JSONResponse:
        return await call("tokenizer_info", {})
