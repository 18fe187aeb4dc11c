"""The engine path every API dialect shares (frontend/serving.py's OpenAI endpoints, and
frontend/api/'s Anthropic and Responses ones over its chat path): build the tokenizer
requests, pick the replica, submit, and respond.

```
 TokenizeRequest × n (tokenize_requests) ─submit─▶ await the first output
     ─┬─ stream: SSE / plain text (stream), headers sent with the first output
      └─ else: one JSON once every choice finished
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
from collections.abc import AsyncIterator, Callable
from functools import partial
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from common.auth import sign_rid
from common.config import Config
from common.log import get_logger
from common.messages import TokenizeRequest
from common.sampling_params import SamplingParams
from frontend.api.openai_format import Choice, ResponseFormat
from frontend.cluster.engine_client import EngineClient
from frontend.cluster.routing import prefix_key
from frontend.errors import APIError
from frontend.generate_format import GenerateFormat
from frontend.protocol import ChatCompletionRequest, CompletionRequest, GenerateRequest, Prompt
from frontend.request_handle import ClientDisconnected, Delta, RequestHandle

RANK_HEADER = "x-data-parallel-rank"

log = get_logger("frontend.serving")

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
CLIENT_CLOSED = 499  # never seen by the client: it is gone
AnyRequest = CompletionRequest | ChatCompletionRequest | GenerateRequest


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


class EnginePath:
    def __init__(self, config: Config, client: EngineClient) -> None:
        self.config, self.client = config, client

    pid = os.getpid()  # TokenizeRequest.origin

    def tokenize_requests(
        self,
        rid: str,
        params: list[SamplingParams],
        req: AnyRequest,
        *,
        kind: str,
        prompt: str | None = None,
        prompt_token_ids: bytes | None = None,
        messages: list | None = None,
        prompts: list[Prompt] | None = None,
        tools: list | None = None,
        template_kwargs: dict[str, Any] | None = None,
        prediction: str | None = None,
    ) -> list[TokenizeRequest]:
        """One TokenizeRequest per choice, the only place they are built; sub-request ids
        `<rid>-<i>`, signed for the scheduler (common.auth). With `prompts` (a batch), the
        choices are prompt by prompt, len(params) each. `prediction`: OpenAI's predicted
        output's text (frontend.prediction)."""
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
                frontend=self.config.frontend_id,
                tools=tools,
                chat_template_kwargs=template_kwargs,
                prediction=prediction,
            )
            for j, (text, packed, _) in enumerate(prompts)
            for i, p in enumerate(params)
        ]

    def route(
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

    async def serve(
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
                self.stream(handle, fmt, choices, first),
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

    async def stream(
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
