"""The engine path every API dialect shares (frontend/api/openai.py's endpoints, and the
Anthropic and Responses ones over its chat path): a checked request (EngineJob) built into
the tokenizer requests, its replica picked, submitted, and the response.

```
 EngineJob ─▶ TokenizeRequest × n (tokenize_requests), route ─submit─▶ await the first
     output ─┬─ stream: SSE / plain text (stream), headers sent with the first output
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
from dataclasses import dataclass, field
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
from frontend.api.openai_protocol import Prompt, SamplingFields
from frontend.cluster.engine_client import EngineClient
from frontend.cluster.routing import prefix_key
from frontend.errors import APIError
from frontend.generate_format import GenerateFormat
from frontend.intake import Arrival
from frontend.request_handle import ClientDisconnected, Delta, RequestHandle

RANK_HEADER = "x-data-parallel-rank"

log = get_logger("frontend.engine_path")

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
CLIENT_CLOSED = 499  # never seen by the client: it is gone


@dataclass
class EngineJob:
    """A checked request as a dialect hands it to the engine path. Its choices are
    `params` (one per choice), for each of `prompts` (a completion batch: prompt by
    prompt), or for `messages` (a chat)."""

    rid: str  # the request id; choice i is sub-request `<rid>-<i>`
    kind: str  # "chat" | "completion" (TokenizeRequest.kind)
    params: list[SamplingParams]
    arrival: Arrival
    stream: bool
    aliases: dict[str, str] = field(default_factory=dict)  # SamplingParams name -> field
    return_timings: bool = False
    pin: int | None = None  # the replica the body pinned (data_parallel_rank)
    prompts: list[Prompt] = field(default_factory=list)  # (text, packed ids, ids)
    messages: list | None = None
    tools: list | None = None
    template_kwargs: dict[str, Any] | None = None
    prediction: str | None = None  # OpenAI's predicted output's text (frontend.prediction)
    continue_final: bool = False  # the chat's final (assistant) message is continued

    @classmethod
    def of(
        cls,
        req: SamplingFields,
        rid: str,
        kind: str,
        params: list[SamplingParams],
        arrival: Arrival,
        aliases: dict[str, str],
        **choices: Any,
    ) -> EngineJob:
        """The job of a parsed body: its stream, return_timings and data_parallel_rank;
        `choices`: its prompts or messages and what goes with them (fields of EngineJob)."""
        stream, timings, pin = bool(req.stream), bool(req.return_timings), req.data_parallel_rank
        return cls(rid, kind, params, arrival, stream, aliases, timings, pin, **choices)

    def route_text(self) -> tuple[str | None, list[int] | None]:
        """The prompt text (or ids) whose prefix picks the replica: a batch goes where
        its first prompt's prefix is."""
        if self.messages is not None:
            return "\n".join(f"{m.get('role')}: {m.get('content')}" for m in self.messages), None
        text, _, ids = self.prompts[0]
        return text, ids


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

    def tokenize_requests(self, job: EngineJob) -> list[TokenizeRequest]:
        """One TokenizeRequest per choice, the only place they are built; sub-request ids
        `<rid>-<i>`, signed for the scheduler (common.auth)."""
        prompts = job.prompts or [(None, None, None)]
        n = len(job.params)
        return [
            TokenizeRequest(
                rid=sign_rid(self.config.ipc.secret, f"{job.rid}-{j * n + i}"),
                kind=job.kind,
                prompt=text,
                prompt_token_ids=packed,
                messages=job.messages,
                params=p,
                origin=self.pid,
                frontend=self.config.frontend_id,
                tools=job.tools,
                chat_template_kwargs=job.template_kwargs,
                prediction=job.prediction,
                continue_final=job.continue_final,
            )
            for j, (text, packed, _) in enumerate(prompts)
            for i, p in enumerate(job.params)
        ]

    def route(self, request: Request, job: EngineJob) -> tuple[int | None, bytes | None]:
        """(the replica the client pinned, or None; the prompt's prefix key), see
        frontend.cluster.routing."""
        pin = job.pin
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
        text, ids = job.route_text()
        return pin, prefix_key(text, ids, facts.block_size)

    async def serve(
        self, request: Request, job: EngineJob, fmt: ResponseFormat | GenerateFormat
    ) -> Response:
        """Submit, then one JSON response once every choice finished, or a stream that
        starts (headers sent) with the first output."""
        reqs = self.tokenize_requests(job)
        pin, key = self.route(request, job)
        arrival = job.arrival
        handle = await self.client.submit(
            reqs,
            arrival.monotonic,
            request.receive,
            job.aliases,
            job.return_timings,
            pin,
            key,
            arrival.wall,
        )
        choices = [Choice(i, fmt.prompt_index(i)) for i in range(handle.n)]
        handed_over = False
        try:
            if not job.stream:
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
