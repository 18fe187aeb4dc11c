"""A request's SamplingParams, one per choice, from the OpenAI sampling fields: the one
validation of the parameters, against the server's limits and the replicas' vocabulary.

A request that sets no max_tokens gets the endpoint's default (16 for completions, as
OpenAI; 64 new tokens for /generate; for chat, the rest of the context), capped by the
server's max_tokens limit and by the room the prompt leaves in the context: it travels
unset with that cap (`sampling_params`), and the tokenizer worker, which knows the prompt
length, settles it (common.limits.settle_max_tokens).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from common.config import ServerConfig
from common.model_facts import ModelFacts
from common.sampling_params import InvalidParameterError, SamplingParams
from frontend.api.openai_protocol import ChatCompletionRequest, SamplingFields, check_unsupported
from frontend.errors import APIError, invalid, renamed
from frontend.structured import structured_alias, structured_from_request

SEED_SPAN = 2**64  # seeds are 64-bit; seed+i wraps around inside that range


def default_max_tokens(default: int | None, limit: int | None) -> int | None:
    """What a request that sets no max_tokens may get, before its prompt length is known:
    the endpoint's default (None: the rest of the context) capped by the server's limit."""
    if default is None:
        return limit
    return default if limit is None else min(default, limit)


def sampling_params(
    req: SamplingFields,
    max_tokens: int | None,
    cap: int | None,
    logprobs: int | None,
    server: ServerConfig,
    aliases: dict[str, str] | None = None,
    prompt_logprobs: int | None = None,
    num_prompts: int = 1,
    facts: ModelFacts | None = None,
) -> tuple[list[SamplingParams], dict[str, str]]:
    """One validated SamplingParams per choice (n), seeds seed+i when a seed is given; and
    the request fields its errors name (`aliases` and the structured-output field's).
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
    aliases = {**aliases, **structured_alias(req)}
    fields["structured"] = structured_from_request(req)
    if req.logit_bias:
        fields["logit_bias"] = req.logit_bias  # its ids meet the vocabulary in common.limits
    try:
        base = SamplingParams.from_dict(fields).validate(facts.vocab_size if facts else None)
    except InvalidParameterError as e:
        raise renamed(APIError(400, str(e), "invalid_request_error", e.param), aliases) from None
    seed = base.seed
    if seed is None:
        return [replace(base) for _ in range(n)], aliases
    return [
        replace(base, seed=seed + i - (SEED_SPAN if seed + i >= SEED_SPAN else 0)) for i in range(n)
    ], aliases


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


def chat_sampling(
    req: ChatCompletionRequest, server: ServerConfig, facts: ModelFacts | None
) -> tuple[list[SamplingParams], dict[str, str], int | None]:
    """A chat request's SamplingParams per choice, the request fields its errors name
    (param_aliases), and its logprobs (None: none asked)."""
    logprobs, max_tokens, aliases = chat_logprobs(req), chat_max_tokens(req), param_aliases(req)
    cap = default_max_tokens(None, server.max_tokens_limit)
    params, aliases = sampling_params(req, max_tokens, cap, logprobs, server, aliases, facts=facts)
    return params, aliases, logprobs
