"""The OpenAI surface's generation endpoints: /v1/completions, /v1/chat/completions and
/generate, each read → validate → build its requests and response format, then the engine
path every dialect shares (frontend/engine_path.py).

```
 body (≤ max_body_bytes) ─parse─▶ pydantic model ─▶ SamplingParams dicts (400 early)
   ─▶ EnginePath: TokenizeRequest × n ─submit─▶ stream or one JSON
```
The three endpoints differ only in how they read the body and in their response format
(frontend.api.openai_format: OpenAI's, or /generate's plain text). `chat_request` is also the
engine path of the dialects in frontend/api/ that translate their bodies into a chat one.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import TypeVar

from fastapi import Request
from fastapi.responses import Response

from common.config import Config
from common.tool_formats import ToolFormat, tool_format
from frontend.api.openai_format import ChatFormat, CompletionFormat, ResponseFormat
from frontend.chat_history import chat_messages
from frontend.cluster.engine_client import EngineClient
from frontend.engine_path import EnginePath
from frontend.errors import APIError
from frontend.generate_format import GenerateFormat
from frontend.prediction import prediction_text
from frontend.protocol import (
    DEFAULT_MAX_NEW_TOKENS_GENERATE,
    DEFAULT_MAX_TOKENS_COMPLETION,
    ChatCompletionRequest,
    CompletionRequest,
    GenerateRequest,
    Prompt,
    chat_logprobs,
    chat_max_tokens,
    completion_prompts,
    default_max_tokens,
    param_aliases,
    parse,
    sampling_params,
)
from frontend.reasoning import ReasoningSplit, template_kwargs
from frontend.request_body import read_body
from frontend.structured import structured_alias
from frontend.tools.chat_format import ToolChatFormat
from frontend.tools.request import apply_tools, tool_request

Body = TypeVar("Body", CompletionRequest, ChatCompletionRequest, GenerateRequest)


class Serving:
    def __init__(self, config: Config, client: EngineClient) -> None:
        self.config = config
        self.client = client
        self.model_name = config.model_name
        self.aliases = {config.model_name, config.engine.model.model}
        self._parser_name: str | None = config.server.tool_call_parser
        self.path = EnginePath(config, client)  # the flow every dialect shares

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
        prediction = prediction_text(req.prediction, len(params) * len(prompts))
        reqs = self.path.tokenize_requests(
            rid, params, req, kind="completion", prompts=prompts, prediction=prediction
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
        return await self.path.serve(
            request,
            reqs,
            (arrival, wall),
            fmt,
            bool(req.stream),
            aliases,
            return_timings=bool(req.return_timings),
            route=self.path.route(request, req, first_text, first_ids),
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
        wrap: Callable[[ResponseFormat, ToolFormat | None], ResponseFormat] | None = None,
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
        if tools is not None and tools.parsed:  # frontend.tools.request: maybe forced by a grammar
            parser = tool_format(await self._tool_call_parser())
            apply_tools(params, tools, parser, req.skip_special_tokens)
        rid = f"chatcmpl-{uuid.uuid4().hex}"
        reqs = self.path.tokenize_requests(
            rid,
            params,
            req,
            kind="chat",
            messages=messages,
            tools=tools.tools if tools is not None else None,
            template_kwargs=extra,
            prediction=prediction_text(req.prediction, len(params)),
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
        return await self.path.serve(
            request,
            reqs,
            (arrival, wall),
            fmt,
            bool(req.stream),
            aliases,
            bool(req.return_timings),
            self.path.route(request, req, text, None),
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
        reqs = self.path.tokenize_requests(
            f"gen-{uuid.uuid4().hex}",
            params,
            req,
            kind="completion",
            prompt=req.prompt,
        )
        return await self.path.serve(
            request,
            reqs,
            (arrival, wall),
            GenerateFormat(),
            req.stream is not False,
            aliases,
            bool(req.return_timings),
            self.path.route(request, req, req.prompt, None),
        )
