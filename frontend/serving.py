"""A generation request's life in the frontend: read → validate → submit → respond.

```
 body (≤ max_body_bytes) ─parse─▶ pydantic model ─▶ SamplingParams dicts (400 early)
   ─submit─▶ TokenizeRequest × n ─▶ await the first output ─┬─ stream: SSE / plain text
                                                           └─ else: one JSON
```
The three endpoints differ only in how they read the body and in their response format
(frontend.responses: OpenAI's, or /generate's plain text); `_serve` and `_stream` are
the one flow they share.

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
from typing import Any, TypeVar

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from common.auth import sign_rid
from common.config import Config
from common.log import get_logger
from common.messages import TokenizeRequest
from frontend.cluster.engine_client import EngineClient
from frontend.cluster.routing import prefix_key
from frontend.errors import APIError
from frontend.generate_format import GenerateFormat
from frontend.protocol import (
    DEFAULT_MAX_NEW_TOKENS_GENERATE,
    DEFAULT_MAX_TOKENS_COMPLETION,
    ChatCompletionRequest,
    CompletionRequest,
    GenerateRequest,
    Prompt,
    chat_logprobs,
    chat_max_tokens,
    chat_messages,
    completion_prompts,
    default_max_tokens,
    param_aliases,
    parse,
    sampling_params,
)
from frontend.reasoning import ReasoningSplit, template_kwargs
from frontend.request_handle import ClientDisconnected, Delta, RequestHandle
from frontend.responses import ChatFormat, Choice, CompletionFormat, ResponseFormat
from frontend.structured import structured_alias
from frontend.tool_format import ToolChatFormat
from frontend.tool_grammar import apply_tools
from frontend.tool_parsers import ToolParser, get_parser
from frontend.tools import tool_request

RANK_HEADER = "x-data-parallel-rank"

log = get_logger("frontend.serving")

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
CLIENT_CLOSED = 499  # never seen by the client: it is gone
Body = TypeVar("Body", CompletionRequest, ChatCompletionRequest, GenerateRequest)


class ReleasingStreamingResponse(StreamingResponse):
    """A StreamingResponse that calls `on_close` however the response ends."""

    def __init__(self, content: AsyncIterator[str], on_close: Callable[[], None], **kwargs) -> None:
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
    if media != "application/json" and not (
        media.startswith("application/") and media.endswith("+json")
    ):
        raise APIError(
            415,
            f"Content-Type must be application/json, got {declared[:100]!r}",
            code="unsupported_media_type",
        )


async def read_body(request: Request, max_bytes: int) -> bytes:
    """The request body, or 413 as soon as it is known to exceed max_bytes; 415 when it is
    declared as something other than JSON."""
    check_content_type(request)
    length = request.headers.get("content-length")
    if length is not None and (not length.isdigit() or int(length) > max_bytes):
        if not length.isdigit():
            raise APIError(400, "invalid Content-Length header")
        raise APIError(
            413, f"request body larger than {max_bytes} bytes", param=None, code="request_too_large"
        )
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_bytes:
            raise APIError(
                413, f"request body larger than {max_bytes} bytes", code="request_too_large"
            )
        chunks.append(chunk)
    return b"".join(chunks)


class Serving:
    def __init__(self, config: Config, client: EngineClient) -> None:
        self.config = config
        self.client = client
        self.model_name = config.model_name
        self.aliases = {config.model_name, config.engine.model.model}
        self._parser_name: str | None = config.server.tool_call_parser

    pid = os.getpid()  # TokenizeRequest.origin

    def check_model(self, model: str | None) -> None:
        if model is None or model in self.aliases:
            return
        engine = self.client.cluster.engine
        if engine is not None and model == engine.model:
            return
        raise APIError(
            404,
            f"The model `{model}` does not exist.",
            "invalid_request_error",
            "model",
            "model_not_found",
        )

    def _default_max_tokens(self, endpoint_default: int | None) -> int | None:
        return default_max_tokens(endpoint_default, self.config.server.max_tokens_limit)

    async def _parse(self, request: Request, model: type[Body]) -> tuple[Body, float, float]:
        """The body as `model`, for a known model name, and when the request arrived:
        (body, monotonic, wall-clock), both taken before the body is read."""
        arrival, wall = time.monotonic(), time.time()
        req = parse(model, await read_body(request, self.config.server.max_body_bytes))
        self.check_model(req.model)
        return req, arrival, wall

    def _tokenize_requests(
        self,
        rid: str,
        params: list[dict[str, Any]],
        req: Body,
        max_tokens_unset: bool,
        *,
        kind: str,
        prompt: str | None = None,
        prompt_token_ids: bytes | None = None,
        messages: list | None = None,
        prompts: list[Prompt] | None = None,
        tools: list | None = None,
        template_kwargs: dict[str, Any] | None = None,
    ) -> list[TokenizeRequest]:
        """One TokenizeRequest per choice, the only place they are built; sub-request ids
        `<rid>-<i>`, signed for the scheduler (common.auth). With `prompts` (a batch), the
        choices are prompt by prompt, len(params) each."""
        if prompts is None:
            prompts = [(prompt, prompt_token_ids, None)]
        return [
            TokenizeRequest(
                rid=sign_rid(self.config.ipc.secret, f"{rid}-{j * len(params) + i}"),
                kind=kind,
                prompt=text,
                prompt_token_ids=packed,
                messages=messages,
                params=p,
                origin=self.pid,
                max_tokens_unset=max_tokens_unset,
                tools=tools,
                chat_template_kwargs=template_kwargs,
            )
            for j, (text, packed, _) in enumerate(prompts)
            for i, p in enumerate(params)
        ]

    # -- endpoints --------------------------------------------------------------------------
    async def completions(self, request: Request) -> Response:
        req, arrival, wall = await self._parse(request, CompletionRequest)
        prompts = completion_prompts(req)
        default = self._default_max_tokens(DEFAULT_MAX_TOKENS_COMPLETION)
        # echo with max_tokens 0 scores the prompt without generating: as vLLM, one token
        # is generated (the prefill samples it anyway) and dropped (CompletionFormat.echo_only)
        echo_only = bool(req.echo) and req.max_tokens == 0
        aliases = structured_alias(req)
        max_tokens = 1 if echo_only else req.max_tokens
        params = sampling_params(
            req,
            max_tokens,
            default,
            req.logprobs,
            self.config.server,
            aliases,
            prompt_logprobs=req.logprobs if req.echo else None,
            num_prompts=len(prompts),
            facts=self.client.cluster.facts(),
        )
        rid = f"cmpl-{uuid.uuid4().hex}"
        reqs = self._tokenize_requests(
            rid, params, req, max_tokens is None, kind="completion", prompts=prompts
        )
        echo = await self._echo_texts(prompts) if req.echo else None
        fmt = CompletionFormat(
            rid,
            self.model_name,
            int(wall),
            req.logprobs is not None,
            req.include_usage,
            req.continuous_usage,
            echo=echo,
            echo_only=echo_only,
            n=len(params),
        )
        first_text, _, first_ids = prompts[0]  # a batch goes where its first prompt's prefix is
        return await self._serve(
            request,
            reqs,
            (arrival, wall),
            fmt,
            bool(req.stream),
            aliases,
            return_timings=bool(req.return_timings),
            route=self._route(request, req, first_text, first_ids),
        )

    async def _echo_texts(self, prompts: list[Prompt]) -> list[str]:
        """Each prompt's text, for echo: token-id prompts decoded by the tokenizer pool
        (as vLLM: special tokens kept)."""
        out: list[str] = []
        for text, _, ids in prompts:
            if text is None:
                try:
                    answer = await self.client.tokenizer_calls.call("detokenize", {"tokens": ids})
                except APIError as e:
                    if e.param == "tokens":  # ids outside the vocabulary
                        e.param, e.message = "prompt", e.message.replace("tokens", "prompt")
                    raise
                decoded = answer.get("prompt")
                text = decoded if isinstance(decoded, str) else ""
            out.append(text)
        return out

    async def chat(self, request: Request) -> Response:
        req, arrival, wall = await self._parse(request, ChatCompletionRequest)
        return await self.chat_request(request, req, arrival, wall)

    async def chat_request(
        self,
        request: Request,
        req: ChatCompletionRequest,
        arrival: float,
        wall: float,
        wrap: Callable[[ResponseFormat, ToolParser | None], ResponseFormat] | None = None,
    ) -> Response:
        """A parsed chat request served (also the engine path of the dialects in
        frontend/api/ that translate their bodies into one). `wrap`: a dialect's response
        shape over the chat one (given the tool-call parser, if the text is parsed)."""
        messages = chat_messages(req.messages)
        extra = template_kwargs(req.chat_template_kwargs, req.reasoning_effort)
        logprobs = chat_logprobs(req)
        aliases = {**param_aliases(req), **structured_alias(req)}
        default = self._default_max_tokens(None)
        max_tokens = chat_max_tokens(req)
        params = sampling_params(
            req,
            max_tokens,
            default,
            logprobs,
            self.config.server,
            aliases,
            facts=self.client.cluster.facts(),
        )
        tools = tool_request(req.tools, req.tool_choice, req.parallel_tool_calls)
        parser = None
        if tools is not None and tools.parsed:  # frontend.tools: maybe forced by a grammar
            parser = get_parser(await self._tool_call_parser())
            apply_tools(params, tools, parser, req.skip_special_tokens)
        rid = f"chatcmpl-{uuid.uuid4().hex}"
        reqs = self._tokenize_requests(
            rid,
            params,
            req,
            max_tokens is None,
            kind="chat",
            messages=messages,
            tools=tools.tools if tools is not None else None,
            template_kwargs=extra,
        )
        args = (rid, self.model_name, int(wall), logprobs is not None)
        fmt: ResponseFormat = (
            ChatFormat(*args, req.include_usage, req.continuous_usage)
            if parser is None
            else ToolChatFormat(*args, req.include_usage, req.continuous_usage, parser=parser)
        )
        if self.config.server.reasoning_parser is not None:  # tools see only the content
            fmt.reasoning = ReasoningSplit(self.config.server.reasoning_parser)
        if wrap is not None:
            fmt = wrap(fmt, parser)
        text = "\n".join(f"{m.get('role')}: {m.get('content')}" for m in messages)
        return await self._serve(
            request,
            reqs,
            (arrival, wall),
            fmt,
            bool(req.stream),
            aliases,
            bool(req.return_timings),
            self._route(request, req, text, None),
        )

    async def _tool_call_parser(self) -> str:
        """The format of tool calls: the tokenizer pool's answer (it renders the prompts in
        that format; tokenizer_worker.tool_prompt), asked once."""
        if self._parser_name is None:
            info = await self.client.tokenizer_calls.call("tokenizer_info", {})
            name = info.get("tool_call_parser")
            self._parser_name = name if isinstance(name, str) else "hermes"
        return self._parser_name

    async def generate(self, request: Request) -> Response:
        req, arrival, wall = await self._parse(request, GenerateRequest)
        aliases = {**param_aliases(max_tokens="max_new_tokens"), **structured_alias(req)}
        if req.n not in (None, 1):
            raise APIError(
                400, "n: /generate returns one text; use /v1/completions for n > 1", param="n"
            )
        default = self._default_max_tokens(DEFAULT_MAX_NEW_TOKENS_GENERATE)
        params = sampling_params(
            req,
            req.max_new_tokens,
            default,
            None,
            self.config.server,
            aliases,
            facts=self.client.cluster.facts(),
        )
        reqs = self._tokenize_requests(
            f"gen-{uuid.uuid4().hex}",
            params,
            req,
            req.max_new_tokens is None,
            kind="completion",
            prompt=req.prompt,
        )
        return await self._serve(
            request,
            reqs,
            (arrival, wall),
            GenerateFormat(),
            req.stream is not False,
            aliases,
            bool(req.return_timings),
            self._route(request, req, req.prompt, None),
        )

    def _route(
        self,
        request: Request,
        req: CompletionRequest | ChatCompletionRequest | GenerateRequest,
        text: str | None,
        ids: list[int] | None,
    ) -> tuple[int | None, bytes | None]:
        """(the replica the client pinned, or None; the prompt's prefix key)."""
        pin = req.data_parallel_rank
        header = request.headers.get(RANK_HEADER)
        if pin is None and header is not None:
            if not header.strip().lstrip("-").isdigit():
                raise APIError(
                    400,
                    f"X-Data-Parallel-Rank must be an integer, got {header[:20]!r}",
                    param="data_parallel_rank",
                )
            pin = int(header)
        # the replicas' KV block (their announced facts); none joined yet: no prefix key
        facts = self.client.cluster.facts()
        if facts is None or facts.block_size <= 0:
            return pin, None
        return pin, prefix_key(text, ids, facts.block_size)

    # -- the shared flow --------------------------------------------------------------------
    async def _serve(
        self,
        request: Request,
        reqs: list[TokenizeRequest],
        arrival: tuple[float, float],
        fmt: ResponseFormat | GenerateFormat,
        stream: bool,
        aliases: dict[str, str] | None = None,
        return_timings: bool = False,
        route: tuple[int | None, bytes | None] = (None, None),
    ) -> Response:
        """Submit, then one JSON response once every choice finished, or a stream that
        starts (headers sent) with the first output. `route`: (pinned replica, prefix
        key), see frontend.cluster.routing; `arrival`: (monotonic, wall clock)."""
        handle = await self.client.submit(
            reqs, arrival[0], request.receive, aliases, return_timings, *route, arrival[1]
        )
        choices = [Choice(i, fmt.prompt_index(i)) for i in range(handle.n)]
        handed_over = False
        try:
            if not stream:
                while not handle.done:
                    d = fmt.filter(await handle.next())
                    choices[d.index].add(d, keep=True)
                return JSONResponse(fmt.response(choices))
            first = fmt.filter(await handle.next())
            response = ReleasingStreamingResponse(
                self._stream(handle, fmt, choices, first),
                partial(self.client.release, handle, "client_disconnect"),
                media_type=fmt.media_type,
                headers=SSE_HEADERS,
            )
            handed_over = True
            return response
        except ClientDisconnected:
            return Response(status_code=CLIENT_CLOSED)
        finally:
            if not handed_over:  # done, failed or cancelled: abort what still runs
                self.client.release(handle, "error")

    async def _stream(
        self,
        handle: RequestHandle,
        fmt: ResponseFormat | GenerateFormat,
        choices: list[Choice],
        first: Delta,
    ) -> AsyncIterator[str]:
        """The stream's parts; outputs already queued are written together in one chunk."""
        parts = fmt.stream_start(handle.n, first.num_prompt_tokens)
        d = first
        try:
            while True:
                offset, lps = choices[d.index].add(d, keep=False)
                if part := fmt.stream_delta(d, offset, lps):
                    parts.append(part)
                if handle.done:
                    break
                if parts and not handle.ready():
                    yield "".join(parts)
                    parts.clear()
                d = fmt.filter(await handle.next())
        except ClientDisconnected:
            return
        except APIError as e:
            self.client.release(handle, "error")
            if not (part := fmt.stream_error(e)):
                log.warning("%s failed mid-stream: %s", handle.rids[0], e.message)
            parts.append(part)
        else:
            parts.append(fmt.stream_end(choices))
        if tail := "".join(parts):
            yield tail
