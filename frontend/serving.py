"""A generation request's life in the frontend: read → validate → submit → respond.

```
 body (≤ max_body_bytes) ─parse─▶ pydantic model ─▶ SamplingParams dicts (400 early)
   ─submit─▶ TokenizeRequest × n ─▶ await the first output ─┬─ stream: SSE / plain text
                                                           └─ else: one JSON
```

Streaming responses wait for the first output (or error) before sending headers, so an
error the workers report up front (prompt too long, bad parameter) is a real HTTP error
status even when `stream` is true; errors after that are an SSE `{"error": ...}` event
followed by `[DONE]`. Every exit path releases the handle: whatever still runs when the
HTTP side gives up is aborted at the scheduler (reason "client_disconnect" for a cut
stream). The disconnect watcher and the timeout timer abort independently of the
response, so a client that vanishes while nothing is being sent is noticed at once.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import AsyncIterator, Callable
from functools import partial

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from common.auth import sign_rid
from common.config import Config
from common.log import get_logger
from common.messages import TokenizeRequest
from frontend.engine_client import EngineClient
from frontend.errors import APIError
from frontend.protocol import (
    DEFAULT_MAX_NEW_TOKENS_GENERATE,
    DEFAULT_MAX_TOKENS_COMPLETION,
    ChatCompletionRequest,
    CompletionRequest,
    GenerateRequest,
    chat_logprobs,
    chat_max_tokens,
    chat_messages,
    completion_prompt,
    default_max_tokens,
    param_aliases,
    parse,
    sampling_params,
)
from frontend.request_handle import ClientDisconnected, Delta, RequestHandle
from frontend.responses import ChatFormat, Choice, CompletionFormat, ResponseFormat, sse, usage

log = get_logger("frontend.serving")

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
CLIENT_CLOSED = 499  # never seen by the client: it is gone


class ReleasingStreamingResponse(StreamingResponse):
    """A StreamingResponse that calls `on_close` however the response ends."""

    def __init__(self, content: AsyncIterator[str], on_close: Callable[[], None],
                 **kwargs) -> None:  # fmt: skip
        super().__init__(content, **kwargs)
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._on_close()


def check_content_type(request: Request) -> None:
    """415 unless the body is declared JSON (or not declared at all). A browser may POST
    text/plain or a form to any origin without a CORS preflight; parsing such a body as
    JSON would let any web page a local user visits drive this server."""
    declared = request.headers.get("content-type")
    if declared is None:
        return
    media = declared.split(";", 1)[0].strip().lower()
    if media != "application/json" and not (media.startswith("application/")
                                            and media.endswith("+json")):  # fmt: skip
        raise APIError(415, f"Content-Type must be application/json, got {declared[:100]!r}",
                       code="unsupported_media_type")  # fmt: skip


async def read_body(request: Request, max_bytes: int) -> bytes:
    """The request body, or 413 as soon as it is known to exceed max_bytes; 415 when it is
    declared as something other than JSON."""
    check_content_type(request)
    length = request.headers.get("content-length")
    if length is not None and (not length.isdigit() or int(length) > max_bytes):
        if not length.isdigit():
            raise APIError(400, "invalid Content-Length header")
        raise APIError(413, f"request body larger than {max_bytes} bytes", param=None,
                       code="request_too_large")  # fmt: skip
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_bytes:
            raise APIError(413, f"request body larger than {max_bytes} bytes",
                           code="request_too_large")  # fmt: skip
        chunks.append(chunk)
    return b"".join(chunks)


class Serving:
    def __init__(self, config: Config, client: EngineClient) -> None:
        self.config = config
        self.client = client
        self.model_name = config.model_name
        self.aliases = {config.model_name, config.engine.model.model}

    pid = os.getpid()  # TokenizeRequest.origin

    def sign(self, base: str) -> str:
        return sign_rid(self.config.ipc.secret, base)

    def check_model(self, model: str | None) -> None:
        if model is None or model in self.aliases:
            return
        engine = self.client.health.engine
        if engine is not None and model == engine.model:
            return
        raise APIError(404, f"The model `{model}` does not exist.", "invalid_request_error",
                       "model", "model_not_found")  # fmt: skip

    def _default_max_tokens(self, endpoint_default: int | None) -> int | None:
        return default_max_tokens(endpoint_default, self.config.server.max_tokens_limit)

    async def _read(self, request: Request) -> bytes:
        return await read_body(request, self.config.server.max_body_bytes)

    # -- endpoints --------------------------------------------------------------------------
    async def completions(self, request: Request) -> Response:
        arrival, wall = time.monotonic(), time.time()
        req = parse(CompletionRequest, await self._read(request))
        self.check_model(req.model)
        prompt, prompt_ids = completion_prompt(req)
        default = self._default_max_tokens(DEFAULT_MAX_TOKENS_COMPLETION)
        params = sampling_params(req, req.max_tokens, default, req.logprobs, self.config.server)
        rid = f"cmpl-{uuid.uuid4().hex}"
        reqs = [TokenizeRequest(self.sign(f"{rid}-{i}"), "completion", prompt, prompt_ids, None, p, wall,
                                bool(req.return_timings), self.pid, default)
                for i, p in enumerate(params)]  # fmt: skip
        fmt = CompletionFormat(rid, self.model_name, int(wall), req.logprobs is not None,
                               req.include_usage)  # fmt: skip
        return await self._openai(request, reqs, arrival, fmt, bool(req.stream), req.include_usage)

    async def chat(self, request: Request) -> Response:
        arrival, wall = time.monotonic(), time.time()
        req = parse(ChatCompletionRequest, await self._read(request))
        self.check_model(req.model)
        messages = chat_messages(req)
        logprobs = chat_logprobs(req)
        aliases = param_aliases(req)
        default = self._default_max_tokens(None)
        params = sampling_params(req, chat_max_tokens(req), default, logprobs, self.config.server,
                                 aliases)  # fmt: skip
        rid = f"chatcmpl-{uuid.uuid4().hex}"
        reqs = [TokenizeRequest(self.sign(f"{rid}-{i}"), "chat", None, None, messages, p, wall,
                                bool(req.return_timings), self.pid, default)
                for i, p in enumerate(params)]  # fmt: skip
        fmt = ChatFormat(rid, self.model_name, int(wall), logprobs is not None, req.include_usage)
        return await self._openai(request, reqs, arrival, fmt, bool(req.stream), req.include_usage,
                                  aliases)

    async def generate(self, request: Request) -> Response:
        arrival, wall = time.monotonic(), time.time()
        req = parse(GenerateRequest, await self._read(request))
        self.check_model(req.model)
        aliases = param_aliases(max_tokens="max_new_tokens")
        if req.n not in (None, 1):
            raise APIError(400, "n: /generate returns one text; use /v1/completions for n > 1",
                           param="n")  # fmt: skip
        default = self._default_max_tokens(DEFAULT_MAX_NEW_TOKENS_GENERATE)
        params = sampling_params(req, req.max_new_tokens, default, None, self.config.server,
                                 aliases)  # fmt: skip
        rid = f"gen-{uuid.uuid4().hex}"
        reqs = [TokenizeRequest(self.sign(f"{rid}-0"), "completion", req.prompt, None, None, params[0], wall,
                                bool(req.return_timings), self.pid, default)]  # fmt: skip
        handle = await self.client.submit(reqs, arrival, request.receive, aliases)
        choice = Choice(0)
        handed_over = False
        try:
            if req.stream is False:
                while not handle.done:
                    choice.add(await handle.next(), keep=True)
                return JSONResponse({"text": choice.text, "finish_reason": choice.finish_reason,
                                     "usage": usage([choice])})  # fmt: skip
            first = await handle.next()
            response = ReleasingStreamingResponse(
                self._text_stream(handle, first), self._release_cut(handle),
                media_type="text/plain; charset=utf-8", headers=SSE_HEADERS)  # fmt: skip
            handed_over = True
            return response
        except ClientDisconnected:
            return Response(status_code=CLIENT_CLOSED)
        finally:
            if not handed_over:
                self.client.release(handle, "error")

    # -- shared flows -----------------------------------------------------------------------
    def _release_cut(self, handle: RequestHandle) -> Callable[[], None]:
        return partial(self.client.release, handle, "client_disconnect")

    async def _openai(self, request: Request, reqs: list[TokenizeRequest], arrival: float,
                      fmt: ResponseFormat, stream: bool, include_usage: bool,
                      aliases: dict[str, str] | None = None) -> Response:  # fmt: skip
        handle = await self.client.submit(reqs, arrival, request.receive, aliases)
        choices = [Choice(i) for i in range(handle.n)]
        handed_over = False
        try:
            if not stream:
                while not handle.done:
                    d = await handle.next()
                    choices[d.index].add(d, keep=True)
                return JSONResponse(fmt.response(choices))
            first = await handle.next()
            response = ReleasingStreamingResponse(
                self._sse_stream(handle, fmt, choices, first, include_usage),
                self._release_cut(handle), media_type="text/event-stream", headers=SSE_HEADERS,
            )  # fmt: skip
            handed_over = True
            return response
        except ClientDisconnected:
            return Response(status_code=CLIENT_CLOSED)
        finally:
            if not handed_over:  # done, failed or cancelled: abort what still runs
                self.client.release(handle, "error")

    async def _sse_stream(self, handle: RequestHandle, fmt: ResponseFormat, choices: list[Choice],
                          first: Delta, include_usage: bool) -> AsyncIterator[str]:  # fmt: skip
        """SSE events; outputs already queued are written together in one chunk."""
        parts = [sse(c) for c in fmt.start_chunks(handle.n)]
        d = first
        try:
            while True:
                offset, lps = choices[d.index].add(d, keep=False)
                if d.text or d.finish_reason is not None or lps:
                    parts.append(sse(fmt.chunk(d, offset, lps)))
                if handle.done:
                    break
                if parts and not handle.ready():
                    yield "".join(parts)
                    parts.clear()
                d = await handle.next()
        except ClientDisconnected:
            return
        except APIError as e:
            self.client.release(handle, "error")
            parts.append(sse(e.body()))
        else:
            if include_usage:
                parts.append(sse(fmt.usage_chunk(choices)))
        parts.append("data: [DONE]\n\n")
        yield "".join(parts)

    async def _text_stream(self, handle: RequestHandle, first: Delta) -> AsyncIterator[str]:
        """/generate: the text deltas as plain chunks; an error after the start ends it."""
        parts: list[str] = []
        d = first
        try:
            while True:
                if d.text:
                    parts.append(d.text)
                if handle.done:
                    break
                if parts and not handle.ready():
                    yield "".join(parts)
                    parts.clear()
                d = await handle.next()
        except ClientDisconnected:
            return
        except APIError as e:
            self.client.release(handle, "error")
            log.warning("/generate %s failed mid-stream: %s", handle.rids[0], e.message)
        if parts:
            yield "".join(parts)
