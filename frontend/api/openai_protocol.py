"""Request bodies of the OpenAI API (and the seed server's /generate) as pydantic models
(read by frontend.intake), and a completion request's prompts; their SamplingParams are
built in openai_sampling.

As OpenAI does, the schema is strict: a field of the wrong JSON type (`"max_tokens": "3"`,
`"stream": "yes"`) and a field the API does not know (`Unrecognized request argument
supplied`) are 400s. OpenAI fields this server does not implement are accepted only with
a value that changes nothing (`functions: []`, `suffix: ""`, ...); anything else is a
400 naming the field (`check_unsupported`), never silently ignored. `response_format` and
vLLM's `structured_outputs` become SamplingParams.structured (frontend.structured); tools
(`tools`, `tool_choice`, `parallel_tool_calls`) are checked in frontend.tools.request.
`null` means "the default". Parsing errors are 400s naming the field (frontend.intake).
"""

from __future__ import annotations

from typing import Any, Literal, cast

from pydantic import BaseModel

from common.messages import WireError, pack_ids
from frontend.errors import invalid
from frontend.intake import STRICT
from frontend.prediction import PredictionContent

DEFAULT_MAX_TOKENS_COMPLETION = 16  # OpenAI's default for /v1/completions
DEFAULT_MAX_NEW_TOKENS_GENERATE = 64
# chat: None = the rest of the context (OpenAI's and vLLM's default)


class StreamOptions(BaseModel):
    model_config = STRICT
    include_usage: bool | None = False
    include_obfuscation: bool | None = None  # OpenAI's; nothing to obfuscate here
    # vLLM's: with include_usage, every chunk carries its choice's usage so far
    continuous_usage_stats: bool | None = None


class SamplingFields(BaseModel):
    """Fields shared by every generation endpoint."""

    model_config = STRICT

    model: str | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool | None = None
    min_tokens: int | None = None
    skip_special_tokens: bool | None = None
    include_stop_str_in_output: bool | None = None
    speculative: bool | None = None  # extension: False turns speculative decoding off
    n: int | None = 1
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    return_timings: bool | None = False  # extension: per-stage times in the usage
    # extension (vLLM's): the scheduler replica to serve it; also X-Data-Parallel-Rank
    data_parallel_rank: int | None = None
    # structured outputs (frontend.structured): OpenAI's, and vLLM's
    response_format: dict[str, Any] | None = None
    structured_outputs: dict[str, Any] | None = None
    # OpenAI's {"token id": bias in [-100, 100]} (SamplingParams.logit_bias)
    logit_bias: dict[str, float] | None = None
    # OpenAI fields that change nothing here (or are refused by check_unsupported)
    metadata: dict[str, str] | None = None
    store: bool | None = None
    service_tier: str | None = None
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    @property
    def continuous_usage(self) -> bool:
        """vLLM's stream_options.continuous_usage_stats, which needs include_usage."""
        opts = self.stream_options
        return bool(opts and opts.include_usage and opts.continuous_usage_stats)


class CompletionRequest(SamplingFields):
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = None
    logprobs: int | None = None
    echo: bool | None = False
    suffix: str | None = None
    best_of: int | None = None
    prediction: PredictionContent | None = None  # OpenAI's chat field, here too


class ContentPart(BaseModel):
    model_config = STRICT
    type: str
    text: str | None = None
    # non-text parts are refused by chat_messages; their fields parse so the 400 says why
    image_url: Any = None
    input_audio: Any = None
    file: Any = None
    refusal: str | None = None


class ChatMessage(BaseModel):
    model_config = STRICT
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    # fields of an assistant message as the API returns it (clients send them back)
    refusal: str | None = None
    tool_calls: list[Any] | None = None
    function_call: Any = None
    tool_call_id: str | None = None
    audio: Any = None
    annotations: list[Any] | None = None


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage]
    max_tokens: int | None = None
    max_completion_tokens: int | None = None  # wins over max_tokens (OpenAI's newer name)
    logprobs: bool | None = False
    top_logprobs: int | None = None
    tools: list[Any] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    functions: list[Any] | None = None
    function_call: str | dict[str, Any] | None = None
    modalities: list[str] | None = None
    audio: Any = None
    prediction: PredictionContent | None = None  # OpenAI's Predicted Outputs
    # the chat template's thinking switch (frontend.reasoning.template_kwargs)
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high"] | None = None
    chat_template_kwargs: dict[str, Any] | None = None  # more chat template variables
    # vLLM's and transformers': the prompt ends inside the final (assistant) message, which
    # the model continues, instead of opening a new turn after it (Anthropic's prefill)
    continue_final_message: bool = False
    web_search_options: Any = None


class GenerateRequest(SamplingFields):
    """The seed server's /generate: streams plain text by default."""

    prompt: str
    max_new_tokens: int | None = None
    stream: bool | None = True


def check_unsupported(req: SamplingFields) -> None:
    """400 for an OpenAI feature this server does not implement, unless its value asks
    for nothing (no functions, an empty suffix, a text response format, ...)."""
    off: dict[str, Any] = {  # field -> predicate "this value changes nothing"
        "suffix": lambda v: not v,
        "best_of": lambda v: v in (1, req.n),
        "functions": lambda v: not v,
        "function_call": lambda v: v in ("none", "auto"),
        "modalities": lambda v: v == ["text"],
        "audio": lambda v: False,
        "web_search_options": lambda v: False,
    }
    for name, harmless in off.items():
        value = getattr(req, name, None)
        if value is not None and not harmless(value):
            raise invalid(f"{name}: not supported by this server", name)
    if req.stream_options is not None and not req.stream:  # OpenAI's and vLLM's rule
        raise invalid("stream_options: only allowed when stream is true", "stream_options")


# (text prompt, packed token ids, the ids): the text, or the ids packed and as a list
Prompt = tuple[str | None, bytes | None, list[int] | None]


def completion_prompts(req: CompletionRequest) -> list[Prompt]:
    """The prompts of a completion request, as vLLM reads `prompt`: a string, a list of
    token ids, a list of strings or a list of token-id lists (a batch: its choices are
    indexed prompt by prompt, n each). The total, prompts × n, is bounded in
    openai_sampling.sampling_params."""
    p = req.prompt
    if isinstance(p, str):
        return [(p, None, None)]
    if not p:
        raise invalid("prompt must not be empty", "prompt")
    if all(isinstance(t, int) for t in p):
        return [_ids_prompt(cast(list[int], p), "prompt")]
    out: list[Prompt] = []
    for i, one in enumerate(p):
        if isinstance(one, str):
            out.append((one, None, None))
        else:
            out.append(_ids_prompt(cast(list[int], one), f"prompt.{i}"))
    return out


def _ids_prompt(ids: list[int], param: str) -> Prompt:
    if not ids:
        raise invalid(f"{param} must not be empty", param)
    try:
        return None, pack_ids(ids), ids
    except WireError as e:
        raise invalid(f"{param}: {e}", param) from None
