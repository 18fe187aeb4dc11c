"""OpenAI's Responses API over the chat engine path: POST /v1/responses, GET and DELETE
/v1/responses/{id}, GET /v1/responses/{id}/input_items.

```
 body ─parse─▶ ResponsesRequest ─(+ previous_response_id's items, from the store)─▶
   chat_request_of ─▶ ChatCompletionRequest ─▶ ChatPath.serve_chat (frontend.chat_path: tools,
   structured outputs, sampling, tokenization) ─▶ chat JSON / chat SSE
   ─▶ responses_output (response object / Responses events) ─▶ the store (unless store: false)
```
The request is checked once here (the Responses-only fields) and once by the chat path
(everything it shares with chat); the chat path's errors name the Responses fields
(`rename`). Stored responses keep the whole conversation they answered, so a chain of
previous_response_id needs one look-up, and input_items lists that whole conversation
(previous responses' inputs and outputs too), each item with an id to page by.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterable, AsyncIterator
from typing import Annotated, Any

from fastapi import Query, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from frontend.api.response_store import ResponseStore
from frontend.api.responses_output import (
    EventStream,
    chat_chunks,
    listed_item,
    new_id,
    response_object,
    sse_event,
    with_ids,
)
from frontend.api.responses_protocol import (
    ResponsesRequest,
    chat_request_of,
    check_unsupported,
    input_items,
    rename,
)
from frontend.chat_path import ChatPath
from frontend.errors import APIError, invalid
from frontend.frontends import responses_db
from frontend.intake import Intake
from frontend.room import Room


def not_found(response_id: str, param: str | None = None) -> APIError:
    what = "Previous response" if param else "Response"
    return APIError(
        404,
        f"{what} with id '{response_id}' not found.",
        "invalid_request_error",
        param,
        "not_found",
    )


class ResponsesRoom:
    def __init__(self, intake: Intake, chat: ChatPath, store: ResponseStore) -> None:
        self.intake, self.chat = intake, chat
        self.store = store

    def base(self, req: ResponsesRequest, created: int) -> dict[str, Any]:
        """The response object's fields that echo the request."""
        return {
            "id": new_id("resp"),
            "object": "response",
            "created_at": created,
            "model": self.chat.model_name,
            "error": None,
            "instructions": req.instructions,
            "max_output_tokens": req.max_output_tokens,
            "metadata": req.metadata or {},
            "parallel_tool_calls": req.parallel_tool_calls is not False,
            "previous_response_id": req.previous_response_id,
            "reasoning": {"effort": None, "summary": None},
            "store": req.store is not False,
            "temperature": 1.0 if req.temperature is None else req.temperature,
            "text": req.text.model_dump(exclude_none=True, by_alias=True)
            if req.text
            else {"format": {"type": "text"}},
            "tool_choice": req.tool_choice if req.tool_choice is not None else "auto",
            "tools": [t.model_dump(exclude_none=True) for t in req.tools or ()],
            "top_p": 1.0 if req.top_p is None else req.top_p,
            "truncation": req.truncation or "disabled",
            "user": req.user,
        }

    async def create(self, request: Request) -> Response:
        req, arrival = await self.intake.read(request, ResponsesRequest)
        check_unsupported(req)
        items = input_items(req)
        if req.previous_response_id is not None:
            previous = self.store.get(req.previous_response_id)
            if previous is None:
                raise not_found(req.previous_response_id, "previous_response_id")
            items = [*previous.input_items, *previous.response["output"], *items]
        chat = chat_request_of(req, items)
        try:
            answer = await self.chat.serve_chat(request, chat, arrival)
        except APIError as e:
            raise rename(e) from None
        base = self.base(req, int(arrival.wall))
        if isinstance(answer, StreamingResponse):
            answer.body_iterator = self._events(answer.body_iterator, EventStream(base), req, items)
            return answer
        if not isinstance(answer, JSONResponse) or answer.status_code != 200:
            return answer  # the client is gone
        response = response_object(base, json.loads(bytes(answer.body)))
        self._keep(req, response, items)
        return JSONResponse(response)

    def _keep(
        self, req: ResponsesRequest, response: dict[str, Any], items: list[dict[str, Any]]
    ) -> None:
        if req.store is not False:
            self.store.put(response, with_ids(items))

    async def _events(
        self,
        chat: AsyncIterable[Any],
        events: EventStream,
        req: ResponsesRequest,
        items: list[dict[str, Any]],
    ) -> AsyncIterator[str]:
        """The chat stream's chunks as Responses events, one write per chat write."""
        out = [sse_event(e) for e in events.start()]
        buffer = ""
        async for piece in chat:
            buffer += piece if isinstance(piece, str) else bytes(piece).decode()
            chunks, buffer = chat_chunks(buffer)
            for chunk in chunks:
                made = events.feed(chunk) if chunk is not None else events.done()
                out += [sse_event(e) for e in made]
            if out:
                yield "".join(out)
                out.clear()
        if events.response is not None:
            self._keep(req, events.response, items)

    def retrieve(self, response_id: str) -> JSONResponse:
        stored = self.store.get(response_id)
        if stored is None:
            raise not_found(response_id)
        return JSONResponse(stored.response)

    def input_items(
        self, response_id: str, after: str | None, limit: int, order: str, include: list[str]
    ) -> JSONResponse:
        """OpenAI's list of a response's input items: newest first unless order=asc,
        `limit` (1-100) after the item `after`, as one page with has_more."""
        stored = self.store.get(response_id)
        if stored is None:
            raise not_found(response_id)
        if not 1 <= limit <= 100:
            raise invalid(f"limit: must be in [1, 100], got {limit}", "limit")
        if order not in ("asc", "desc"):
            raise invalid(f"order: must be 'asc' or 'desc', got {order!r}", "order")
        if include:
            raise invalid(f"include: {include[0]!r} is not supported by this server", "include")
        items = [listed_item(i) for i in stored.input_items]
        if order == "desc":
            items.reverse()
        if after is not None:
            ids = [i["id"] for i in items]
            if after not in ids:
                raise invalid(f"after: no input item {after!r} in this response", "after")
            items = items[ids.index(after) + 1 :]
        page = items[:limit]
        return JSONResponse(
            {
                "object": "list",
                "data": page,
                "first_id": page[0]["id"] if page else None,
                "last_id": page[-1]["id"] if page else None,
                "has_more": len(items) > limit,
            }
        )

    def delete(self, response_id: str) -> JSONResponse:
        if not self.store.delete(response_id):
            raise not_found(response_id)
        return JSONResponse({"id": response_id, "object": "response.deleted", "deleted": True})


def add_responses_routes(room: Room) -> ResponsesRoom:
    """POST /v1/responses, GET and DELETE /v1/responses/{response_id}, GET
    /v1/responses/{response_id}/input_items."""
    config = room.chat.config
    # several frontends on the port share one file (frontend.frontends.responses_db)
    store = ResponseStore(
        config.server.responses_store_max,
        config.server.responses_store_bytes,
        responses_db(config),
    )
    responses = ResponsesRoom(room.intake, room.chat, store)
    api = room.api

    async def create_response(request: Request) -> Response:
        return await responses.create(request)

    room.post("/v1/responses", create_response, ResponsesRequest)

    @api.get("/v1/responses/{response_id}")
    async def retrieve_response(response_id: str) -> JSONResponse:
        return responses.retrieve(response_id)

    @api.get("/v1/responses/{response_id}/input_items")
    async def list_input_items(
        response_id: str,
        after: str | None = None,
        limit: int = 20,
        order: str = "desc",
        include: Annotated[list[str] | None, Query()] = None,
    ) -> JSONResponse:
        return responses.input_items(response_id, after, limit, order, include or [])

    @api.delete("/v1/responses/{response_id}")
    async def delete_response(response_id: str) -> JSONResponse:
        return responses.delete(response_id)

    return responses
