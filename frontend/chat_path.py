"""The chat path: a parsed chat request served through the engine path. The OpenAI chat
endpoint and the dialects that translate their bodies into a chat one (Anthropic's
Messages, OpenAI's Responses) all come in here, each with its response shape (`wrap`).

```
 ChatCompletionRequest ─▶ messages (chat_history), template variables (reasoning),
   SamplingParams × n (api/openai_sampling), tools (tools/request), prediction
   ─▶ ChatFormat or ToolChatFormat (+ reasoning split, + the dialect's shape)
   ─▶ EngineJob ─EnginePath.serve─▶ stream or one JSON
```
"""

from __future__ import annotations

import uuid
from collections.abc import Callable

from fastapi import Request
from fastapi.responses import Response

from common.config import Config
from common.tool_formats import ToolFormat
from frontend.api.openai_format import ChatFormat, ResponseFormat
from frontend.api.openai_protocol import ChatCompletionRequest
from frontend.api.openai_sampling import chat_sampling
from frontend.chat_history import chat_messages
from frontend.cluster.engine_client import EngineClient
from frontend.engine_path import EngineJob, EnginePath
from frontend.errors import invalid
from frontend.intake import Arrival
from frontend.prediction import prediction_text
from frontend.reasoning import ReasoningSplit, template_kwargs
from frontend.tools.chat_format import ToolChatFormat
from frontend.tools.request import ServedToolFormat, chat_tools

# a dialect's response shape over the chat one, given the tool-call format (None: the
# text is not parsed for calls)
Wrap = Callable[[ResponseFormat, ToolFormat | None], ResponseFormat]


class ChatPath:
    def __init__(self, config: Config, client: EngineClient, path: EnginePath) -> None:
        self.config, self.client, self.path = config, client, path
        self.server = config.server
        self.model_name = config.model_name
        self.tool_format = ServedToolFormat(config.server.tool_call_parser, client.tokenizer_calls)

    async def serve_chat(
        self,
        request: Request,
        req: ChatCompletionRequest,
        arrival: Arrival,
        wrap: Wrap | None = None,
    ) -> Response:
        messages = chat_messages(req.messages)
        if req.continue_final_message and messages[-1]["role"] != "assistant":
            where = f"messages.{len(messages) - 1}"
            raise invalid(f"continue_final_message: {where} is not an assistant message", where)
        extra = template_kwargs(req.chat_template_kwargs, req.reasoning_effort)
        params, aliases, logprobs = chat_sampling(req, self.server, self.client.cluster.facts())
        tools, parser = await chat_tools(
            req.tools,
            req.tool_choice,
            req.parallel_tool_calls,
            params,
            req.skip_special_tokens,
            self.tool_format,
        )
        prediction = prediction_text(req.prediction, len(params))
        rid = f"chatcmpl-{uuid.uuid4().hex}"
        args = (rid, self.model_name, int(arrival.wall), logprobs is not None)
        fmt: ResponseFormat = (
            ChatFormat(*args, req.include_usage, req.continuous_usage)
            if parser is None
            else ToolChatFormat(*args, req.include_usage, req.continuous_usage, parser=parser)
        )
        if self.server.reasoning_parser is not None:  # tools see only the content
            fmt.reasoning = ReasoningSplit(self.server.reasoning_parser)
        job = EngineJob.of(
            req,
            rid,
            "chat",
            params,
            arrival,
            aliases,
            messages=messages,
            tools=tools.tools if tools is not None else None,
            template_kwargs=extra,
            prediction=prediction,
            continue_final=req.continue_final_message,
        )
        return await self.path.serve(request, job, wrap(fmt, parser) if wrap else fmt)
