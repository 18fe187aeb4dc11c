"""Request bodies of the OpenAI API (and the seed server's /generate) as pydantic models,
and their conversion to what the tokenizer workers take: a prompt and SamplingParams dicts.

Unknown fields are ignored, as OpenAI-compatible servers do; `null` means "the default".
Parsing errors become 400s naming the offending field (see `parse`).
"""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from common.messages import WireError, pack_ids
from common.sampling_params import InvalidParameterError, SamplingParams
from frontend.errors import APIError, invalid, renamed

DEFAULT_MAX_TOKENS_COMPLETION = 16  # OpenAI's default for /v1/completions
# Chat defaults to "the rest of the context" elsewhere; the frontend does not know the
# prompt length, and SamplingParams needs an int, so a fixed, config-free default is used.
DEFAULT_MAX_TOKENS_CHAT = 256
DEFAULT_MAX_NEW_TOKENS_GENERATE = 64
SEED_SPAN = 2**64  # seeds are 64-bit; seed+i wraps around inside that range


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")
    include_usage: bool | None = False


class _Sampling(BaseModel):
    """Fields shared by every generation endpoint."""

    model_config = ConfigDict(extra="ignore")

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
    n: int | None = 1
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    return_timings: bool | None = False  # extension: ask the workers for per-stage times

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class CompletionRequest(_Sampling):
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = None
    logprobs: int | None = None
    echo: bool | None = False


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: str
    text: str | None = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: str
    content: str | list[ContentPart] | None = None
    name: str | None = None


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage]
    max_tokens: int | None = None
    max_completion_tokens: int | None = None  # wins over max_tokens (OpenAI's newer name)
    logprobs: bool | None = False
    top_logprobs: int | None = None


class GenerateRequest(_Sampling):
    """The seed server's /generate: streams plain text by default."""

    prompt: str
    max_new_tokens: int | None = DEFAULT_MAX_NEW_TOKENS_GENERATE
    stream: bool | None = True


M = TypeVar("M", bound=BaseModel)


def parse(model: type[M], body: bytes) -> M:
    """Validate a JSON body; a 400 naming the first offending field on failure."""
    try:
        return model.model_validate_json(body)
    except ValidationError as e:
        err = e.errors(include_url=False)[0]
        if err["type"] == "json_invalid":
            raise invalid(f"Invalid JSON body: {err['msg']}") from None
        loc = [str(p) for p in err["loc"]]
        # unions report the branch tried (e.g. prompt.list[int].0); keep the field path only
        path = [p for p in loc if not (p[:1].isalpha() and ("[" in p or p in _TYPE_NAMES))]
        param = ".".join(path) or None
        raise invalid(f"{param or 'body'}: {err['msg']}", param) from None


_TYPE_NAMES = {"str", "int", "float", "bool"}


def completion_prompt(req: CompletionRequest) -> tuple[str | None, bytes | None]:
    """(text prompt, packed token ids): exactly one is set. Several prompts are refused."""
    if req.echo:
        raise invalid("echo is not supported", "echo")
    p = req.prompt
    if isinstance(p, list) and len(p) == 1 and isinstance(p[0], (str, list)):
        p = p[0]  # a batch of one
    if isinstance(p, str):
        return p, None
    if not p or not all(isinstance(t, int) for t in p):
        msg = (
            "prompt must not be empty"
            if not p
            else ("batched prompts are not supported; send one prompt per request")
        )
        raise invalid(msg, "prompt")
    try:
        return None, pack_ids(p)
    except WireError as e:
        raise invalid(f"prompt: {e}", "prompt") from None


def chat_messages(req: ChatCompletionRequest) -> list[dict[str, Any]]:
    """[{"role", "content"[, "name"]}] with text parts joined; other parts are refused."""
    if not req.messages:
        raise invalid("messages must not be empty", "messages")
    out = []
    for i, m in enumerate(req.messages):
        if m.content is None or isinstance(m.content, str):
            content = m.content or ""
        else:
            bad = [p.type for p in m.content if p.type != "text"]
            if bad:
                raise invalid(f"content part type {bad[0]!r} is not supported",
                              f"messages.{i}.content")  # fmt: skip
            content = "".join(p.text or "" for p in m.content)
        msg: dict[str, Any] = {"role": m.role, "content": content}
        if m.name is not None:
            msg["name"] = m.name
        out.append(msg)
    return out


def sampling_params(req: _Sampling, max_tokens: int, logprobs: int | None,
                    max_n: int, max_tokens_limit: int | None = None,
                    aliases: dict[str, str] | None = None) -> list[dict[str, Any]]:  # fmt: skip
    """One validated SamplingParams dict per choice (n); seeds seed+i when a seed is given.
    `aliases` maps SamplingParams names to the request fields they came from (see
    param_aliases), so that an error names what the client sent."""
    aliases = aliases or {}
    n = 1 if req.n is None else req.n
    if not 1 <= n <= max_n:
        raise invalid(f"n: must be in [1, {max_n}] (the server's limit), got {n}", "n")
    if max_tokens_limit is not None and isinstance(max_tokens, int) and \
            max_tokens > max_tokens_limit:
        param = aliases.get("max_tokens", "max_tokens")
        raise invalid(f"{param}: at most {max_tokens_limit} (the server's max_tokens limit), "
                      f"got {max_tokens}", param)  # fmt: skip
    fields: dict[str, Any] = {"max_tokens": max_tokens, "logprobs": logprobs}
    for name in ("temperature", "top_p", "top_k", "min_p", "presence_penalty",
                 "frequency_penalty", "repetition_penalty", "seed", "stop_token_ids",
                 "ignore_eos", "min_tokens", "skip_special_tokens",
                 "include_stop_str_in_output"):  # fmt: skip
        value = getattr(req, name)
        if value is not None:
            fields[name] = value
    if req.stop is not None:
        fields["stop"] = [req.stop] if isinstance(req.stop, str) else req.stop
    try:
        base = SamplingParams(**fields).validate().to_dict()
    except InvalidParameterError as e:
        raise renamed(APIError(400, str(e), "invalid_request_error", e.param), aliases) from None
    seed = base["seed"]
    if seed is None:
        return [dict(base) for _ in range(n)]
    return [{**base, "seed": seed + i - (SEED_SPAN if seed + i >= SEED_SPAN else 0)}
            for i in range(n)]  # fmt: skip


def param_aliases(req: ChatCompletionRequest | None = None,
                  max_tokens: str | None = None) -> dict[str, str]:
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


def chat_max_tokens(req: ChatCompletionRequest) -> int:
    for value in (req.max_completion_tokens, req.max_tokens):
        if value is not None:
            return value
    return DEFAULT_MAX_TOKENS_CHAT
