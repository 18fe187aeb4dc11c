"""Request bodies of the OpenAI API (and the seed server's /generate) as pydantic models,
and their conversion to what the tokenizer workers take: a prompt and a typed SamplingParams.

As OpenAI does, the schema is strict: a field of the wrong JSON type (`"max_tokens": "3"`,
`"stream": "yes"`) and a field the API does not know (`Unrecognized request argument
supplied`) are 400s. OpenAI fields this server does not implement are accepted only with
a value that changes nothing (`functions: []`, `suffix: ""`, ...); anything else is a
400 naming the field, never silently ignored. `response_format` and vLLM's
`structured_outputs` become SamplingParams.structured (frontend.structured); tools (`tools`,
`tool_choice`, `parallel_tool_calls`) are checked in frontend.tools.request.
`null` means "the default". Parsing errors become 400s naming the field (see `parse`).

A request that sets no max_tokens gets the endpoint's default (16 for completions, as
OpenAI; 64 new tokens for /generate; for chat, the rest of the context), capped by the
server's max_tokens limit and by the room the prompt leaves in the context: it travels
unset with that cap (`sampling_params`), and the tokenizer worker, which knows the prompt
length, settles it (common.limits.settle_max_tokens).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Literal, TypeVar, cast

from pydantic import BaseModel, ConfigDict, ValidationError

from common.config import ServerConfig
from common.messages import WireError, pack_ids
from common.model_facts import ModelFacts
from common.sampling_params import InvalidParameterError, SamplingParams
from frontend.errors import APIError, invalid, renamed
from frontend.prediction import PredictionContent
from frontend.structured import structured_from_request

DEFAULT_MAX_TOKENS_COMPLETION = 16  # OpenAI's default for /v1/completions
DEFAULT_MAX_NEW_TOKENS_GENERATE = 64
# chat: None = the rest of the context (OpenAI's and vLLM's default)
SEED_SPAN = 2**64  # seeds are 64-bit; seed+i wraps around inside that range
STRICT = ConfigDict(extra="forbid", strict=True)


class StreamOptions(BaseModel):
    model_config = STRICT
    include_usage: bool | None = False
    include_obfuscation: bool | None = None  # OpenAI's; nothing to obfuscate here
    # vLLM's: with include_usage, every chunk carries its choice's usage so far
    continuous_usage_stats: bool | None = None


class _Sampling(BaseModel):
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


class CompletionRequest(_Sampling):
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


class ChatCompletionRequest(_Sampling):
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
    web_search_options: Any = None


class GenerateRequest(_Sampling):
    """The seed server's /generate: streams plain text by default."""

    prompt: str
    max_new_tokens: int | None = None
    stream: bool | None = True


def check_unsupported(req: _Sampling) -> None:
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


M = TypeVar("M", bound=BaseModel)


def parse(model: type[M], body: bytes) -> M:
    """Validate a JSON body; a 400 naming the first offending field on failure."""
    try:
        return model.model_validate_json(body)
    except ValidationError as e:
        errors = e.errors(include_url=False)
        err = errors[0]
        if err["type"] == "json_invalid":
            raise invalid(f"Invalid JSON body: {err['msg']}") from None
        extra = [x for x in errors if x["type"] == "extra_forbidden"]
        if extra:  # OpenAI's own words for a field the API does not have
            param = _param(extra[0]["loc"])
            raise invalid(f"Unrecognized request argument supplied: {param}", param) from None
        param = _param(err["loc"])
        raise invalid(f"{param or 'body'}: {err['msg']}", param) from None


def _param(loc: tuple) -> str | None:
    # unions report the branch tried (e.g. prompt.list[int].0); keep the field path only
    path = [str(p) for p in loc]
    path = [p for p in path if not (p[:1].isalpha() and ("[" in p or p in _TYPE_NAMES))]
    return ".".join(path) or None


_TYPE_NAMES = {"str", "int", "float", "bool"}


# (text prompt, packed token ids, the ids): the text, or the ids packed and as a list
Prompt = tuple[str | None, bytes | None, list[int] | None]


def completion_prompts(req: CompletionRequest) -> list[Prompt]:
    """The prompts of a completion request, as vLLM reads `prompt`: a string, a list of
    token ids, a list of strings or a list of token-id lists (a batch: its choices are
    indexed prompt by prompt, n each). The total, prompts × n, is bounded in
    sampling_params."""
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


def default_max_tokens(default: int | None, limit: int | None) -> int | None:
    """What a request that sets no max_tokens may get, before its prompt length is known:
    the endpoint's default (None: the rest of the context) capped by the server's limit."""
    if default is None:
        return limit
    return default if limit is None else min(default, limit)


def sampling_params(
    req: _Sampling,
    max_tokens: int | None,
    cap: int | None,
    logprobs: int | None,
    server: ServerConfig,
    aliases: dict[str, str] | None = None,
    prompt_logprobs: int | None = None,
    num_prompts: int = 1,
    facts: ModelFacts | None = None,
) -> list[SamplingParams]:
    """One validated SamplingParams per choice (n); seeds seed+i when a seed is given.
    A batch of num_prompts prompts has num_prompts × n choices, within the server's
    max_queued_requests (each prompt gets these n).
    The one validation of the parameters (with the replicas' vocabulary, `facts`). A
    max_tokens the client set none of (None) travels as None with `cap`
    (default_max_tokens: the endpoint's default capped by the server's limit) for the
    tokenizer worker to settle against the prompt (common.limits.settle_max_tokens).
    `aliases` maps SamplingParams names to the request fields they came from (see
    param_aliases), so that an error names what the client sent."""
    aliases = aliases or {}
    check_unsupported(req)
    n = 1 if req.n is None else req.n
    if not 1 <= n <= server.max_n:
        raise invalid(f"n: must be in [1, {server.max_n}] (the server's max_n limit), got {n}", "n")
    if n * num_prompts > server.max_queued_requests:
        what = f"{num_prompts} prompts × n = {n}" if num_prompts > 1 else f"n: {n}"
        raise invalid(
            f"{what} choices exceed the server's max_queued_requests limit "
            f"({server.max_queued_requests})",
            "prompt" if num_prompts > 1 else "n",
        )
    limit = server.max_tokens_limit
    if limit is not None and max_tokens is not None and max_tokens > limit:
        param = aliases.get("max_tokens", "max_tokens")
        raise invalid(
            f"{param}: at most {limit} (the server's max_tokens limit), got {max_tokens}", param
        )
    stop = [req.stop] if isinstance(req.stop, str) else req.stop
    if stop is not None and len(stop) > server.max_stop_strings:
        raise invalid(
            f"stop: at most {server.max_stop_strings} stop strings (the server's "
            f"max_stop_strings limit), got {len(stop)}",
            "stop",
        )
    fields: dict[str, Any] = {
        "max_tokens": max_tokens,
        "max_tokens_cap": None if max_tokens is not None else cap,
        "logprobs": logprobs,
        "prompt_logprobs": prompt_logprobs,
    }
    for name in (
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "presence_penalty",
        "frequency_penalty",
        "repetition_penalty",
        "seed",
        "stop_token_ids",
        "ignore_eos",
        "min_tokens",
        "skip_special_tokens",
        "include_stop_str_in_output",
        "speculative",
    ):
        value = getattr(req, name)
        if value is not None:
            fields[name] = value
    if stop is not None:
        fields["stop"] = stop
    fields["structured"] = structured_from_request(req)
    if req.logit_bias:
        fields["logit_bias"] = req.logit_bias  # its ids meet the vocabulary in common.limits
    try:
        base = SamplingParams.from_dict(fields).validate(facts.vocab_size if facts else None)
    except InvalidParameterError as e:
        raise renamed(APIError(400, str(e), "invalid_request_error", e.param), aliases) from None
    seed = base.seed
    if seed is None:
        return [replace(base) for _ in range(n)]
    return [
        replace(base, seed=seed + i - (SEED_SPAN if seed + i >= SEED_SPAN else 0)) for i in range(n)
    ]


def param_aliases(
    req: ChatCompletionRequest | None = None, max_tokens: str | None = None
) -> dict[str, str]:
    """SamplingParams name -> the request field it came from, where they differ."""
    aliases = {"max_tokens": max_tokens} if max_tokens else {}
    if req is not None:
        if req.max_completion_tokens is not None:
            aliases["max_tokens"] = "max_completion_tokens"
        aliases["logprobs"] = "top_logprobs"
    return aliases


def chat_logprobs(req: ChatCompletionRequest) -> int | None:
    if req.top_logprobs is not None and not req.logprobs:
        raise invalid("top_logprobs requires logprobs to be true", "top_logprobs")
    return (req.top_logprobs or 0) if req.logprobs else None


def chat_max_tokens(req: ChatCompletionRequest) -> int | None:
    for value in (req.max_completion_tokens, req.max_tokens):
        if value is not None:
            return value
    return None
