"""The OpenAI dialect's endpoints: /v1/completions, /v1/chat/completions, the seed
server's /generate, and /v1/models. Each reads its body (frontend.intake); completions and
/generate check it into SamplingParams (openai_sampling) and an EngineJob with their
response format (openai_format, or /generate's plain text) for the engine path; chat goes
the chat path that the other dialects share (frontend.chat_path).

```
 body ─intake─▶ pydantic model ─▶ SamplingParams × n, prompts (400 early)
   ─▶ EngineJob ─EnginePath.serve─▶ stream or one JSON
```
"""

from __future__ import annotations

import uuid
from collections.abc import Callable

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from frontend.api.openai_format import CompletionFormat
from frontend.api.openai_protocol import (
    DEFAULT_MAX_NEW_TOKENS_GENERATE,
    DEFAULT_MAX_TOKENS_COMPLETION,
    ChatCompletionRequest,
    CompletionRequest,
    GenerateRequest,
    Prompt,
    completion_prompts,
)
from frontend.api.openai_sampling import default_max_tokens, param_aliases, sampling_params
from frontend.chat_path import ChatPath
from frontend.engine_path import EngineJob, EnginePath
from frontend.errors import APIError
from frontend.generate_format import GenerateFormat
from frontend.intake import Intake
from frontend.prediction import prediction_text
from frontend.room import Room


class OpenAIServing:
    def __init__(self, room: Room) -> None:
        self.server = room.chat.config.server
        self.client = room.client
        self.model_name = room.chat.model_name
        self.intake: Intake = room.intake
        self.chat_path: ChatPath = room.chat
        self.path: EnginePath = room.chat.path

    async def completions(self, request: Request) -> Response:
        req, arrival = await self.intake.read(request, CompletionRequest)
        prompts = completion_prompts(req)
        # echo with max_tokens 0 scores the prompt without generating: as vLLM, one token
        # is generated (the prefill samples it anyway) and dropped (CompletionFormat.echo_only)
        echo_only = bool(req.echo) and req.max_tokens == 0
        params, aliases = sampling_params(
            req,
            1 if echo_only else req.max_tokens,
            default_max_tokens(DEFAULT_MAX_TOKENS_COMPLETION, self.server.max_tokens_limit),
            req.logprobs,
            self.server,
            prompt_logprobs=req.logprobs if req.echo else None,
            num_prompts=len(prompts),
            facts=self.client.cluster.facts(),
        )
        prediction = prediction_text(req.prediction, len(params) * len(prompts))
        rid = f"cmpl-{uuid.uuid4().hex}"
        fmt = CompletionFormat(
            rid,
            self.model_name,
            int(arrival.wall),
            req.logprobs is not None,
            req.include_usage,
            req.continuous_usage,
            echo=await self._echo_texts(prompts) if req.echo else None,
            echo_only=echo_only,
            n=len(params),
        )
        job = EngineJob.of(
            req, rid, "completion", params, arrival, aliases, prompts=prompts, prediction=prediction
        )
        return await self.path.serve(request, job, fmt)

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
        req, arrival = await self.intake.read(request, ChatCompletionRequest)
        return await self.chat_path.serve_chat(request, req, arrival)

    async def generate(self, request: Request) -> Response:
        req, arrival = await self.intake.read(request, GenerateRequest)
        if req.n not in (None, 1):
            raise APIError(
                400, "n: /generate returns one text; use /v1/completions for n > 1", param="n"
            )
        params, aliases = sampling_params(
            req,
            req.max_new_tokens,
            default_max_tokens(DEFAULT_MAX_NEW_TOKENS_GENERATE, self.server.max_tokens_limit),
            None,
            self.server,
            param_aliases(max_tokens="max_new_tokens"),
            facts=self.client.cluster.facts(),
        )
        rid = f"gen-{uuid.uuid4().hex}"
        job = EngineJob.of(req, rid, "completion", params, arrival, aliases)
        job.prompts, job.stream = [(req.prompt, None, None)], req.stream is not False
        return await self.path.serve(request, job, GenerateFormat())


def add_openai_routes(room: Room, model_card: Callable[[], dict]) -> OpenAIServing:
    """The OpenAI dialect's routes; `model_card`: the served model's /v1/models entry."""
    serving = OpenAIServing(room)
    room.post("/v1/completions", serving.completions, CompletionRequest)
    room.post("/v1/chat/completions", serving.chat, ChatCompletionRequest)
    room.post("/generate", serving.generate, GenerateRequest)
    api = room.api

    @api.get("/v1/models")
    async def list_models() -> JSONResponse:
        return JSONResponse({"object": "list", "data": [model_card()]})

    @api.get("/v1/models/{model:path}")
    async def get_model(model: str) -> JSONResponse:
        serving.intake.check_model(model)
        return JSONResponse(model_card())

    return serving
