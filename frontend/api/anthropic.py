"""Anthropic's Messages API, a room over the chat engine path:

    POST /v1/messages               body -> MessagesRequest -> ChatCompletionRequest
                                    (frontend.api.anthropic_protocol) ->
                                    the chat path (frontend.chat_path),
                                    its outputs shaped by AnthropicFormat (anthropic_format)
    POST /v1/messages/count_tokens  {"input_tokens"}: the prompt the same request would
                                    get, tokenized by the tokenizer pool (chat template,
                                    tools rendered in)

Same API key as every route (`x-api-key` or `Authorization: Bearer`, frontend.app). Every
error on these routes, the API key's included, is Anthropic's
`{"type": "error", "error": {"type", "message"}}` (AnthropicRoute).
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute

from common.log import get_logger
from common.tool_formats import ToolFormat
from frontend.api.anthropic_format import AnthropicFormat, error_body
from frontend.api.anthropic_protocol import CountTokensRequest, MessagesRequest, chat_request
from frontend.api.openai_format import ResponseFormat
from frontend.chat_history import chat_messages
from frontend.errors import APIError
from frontend.room import Room
from frontend.tokenizer_api import call_tokenizer
from frontend.tools.request import tool_request

log = get_logger("frontend.api.anthropic")

# the chat path's names for the fields, in its error messages -> Anthropic's
_FIELD_NAMES = (
    ("function.parameters", "input_schema"),
    ("function.description", "description"),
    ("function.name", "name"),
    ("max_completion_tokens", "max_tokens"),
    ("stop: ", "stop_sequences: "),
)


def error_response(e: APIError) -> JSONResponse:
    message = e.message
    for chat_name, name in _FIELD_NAMES:
        message = message.replace(chat_name, name)
    return JSONResponse(error_body(e.status, message), status_code=e.status, headers=e.headers)


class AnthropicRoute(APIRoute):
    """A route whose errors (its dependencies' too: the API key) are Anthropic's shape."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def route(request: Request) -> Response:
            try:
                return await handler(request)
            except APIError as e:
                return error_response(e)
            except Exception:
                log.exception("unhandled error on %s", request.url.path)
                return error_response(APIError(500, "internal server error", "server_error"))

        return route


def add_anthropic_routes(room: Room) -> None:
    """The two routes, each answering errors in Anthropic's shape (AnthropicRoute)."""

    async def messages(request: Request) -> Response:
        req, arrival = await room.intake.read(request, MessagesRequest)
        stops = req.stop_sequences or []

        def wrap(chat: ResponseFormat, parser: ToolFormat | None) -> ResponseFormat:
            return AnthropicFormat(chat, parser, req.model, stops)

        return await room.chat.serve_chat(request, chat_request(req), arrival, wrap)

    async def count_tokens(request: Request) -> JSONResponse:
        req, _ = await room.intake.read(request, CountTokensRequest)
        body = chat_request(req)
        tools = tool_request(body.tools, body.tool_choice, body.parallel_tool_calls)
        args: dict[str, Any] = {
            # the checked history, as the chat path hands it to the tokenizer
            "messages": chat_messages(body.messages),
            "add_generation_prompt": not body.continue_final_message,
            "continue_final_message": body.continue_final_message,
            "add_special_tokens": False,
            "return_token_strs": False,
        }
        if tools is not None:
            args["tools"] = tools.tools
        answer = await call_tokenizer(room.client, "tokenize", args)
        return JSONResponse({"input_tokens": answer["count"]})

    room.post("/v1/messages", messages, MessagesRequest, AnthropicRoute)
    room.post("/v1/messages/count_tokens", count_tokens, CountTokensRequest, AnthropicRoute)
