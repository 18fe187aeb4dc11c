"""What a request must fit, in one place: the vocabulary, the context length, the KV pool.

Parameter ranges are SamplingParams.validate's (once, at the frontend's intake); this
module holds the rules that depend on the prompt and on the model. The tokenizer workers
apply them, once, before a request costs the scheduler anything; the engine applies them
only in its offline API, or to a request nothing proves came through the intake
(common.auth.passed_intake). A tokenizer worker's numbers are the replicas' (the frontend
refuses one that announces others), and a replica's KV pool holds a whole context.

A request that sets no max_tokens is resolved once, then cut once:

    frontend    max_tokens_for(None, default, context)  the endpoint's default (capped by
                                                        the server's limit), else the
                                                        replicas' context length
    tokenizer   RequestLimits.check(max_tokens_unset)   cut to the room the prompt leaves

Torch-free: the tokenizer workers import it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from common.sampling_params import INT64_MAX, InvalidParameterError, SamplingParams


class RequestRejectedError(InvalidParameterError):
    """A request this server can never serve: too long for the context or the KV pool."""


def max_tokens_for(
    max_tokens: int | None, default: int | None, max_model_len: int | None = None
) -> int:
    """The max_tokens a request is validated with before its prompt length is known: the
    client's, if set; else the endpoint's default; else the context length; else (no
    replica announced one yet) no bound. RequestLimits.check cuts an unset one to what
    the prompt leaves of the context."""
    if max_tokens is not None:
        return max_tokens
    return default or max_model_len or INT64_MAX


@dataclass(frozen=True)
class RequestLimits:
    vocab_size: int
    max_model_len: int  # the context length: prompt and output together
    num_blocks: int | None = None  # the KV pool, known to the engine; None: not checked
    block_size: int = 1

    def check_token_ids(self, ids: Sequence[int], param: str = "prompt") -> None:
        """Token ids a client sent must lie in the model's vocabulary (ids a tokenizer made
        from text are the tokenizer's own)."""
        vocab = self.vocab_size
        if ids and (min(ids) < 0 or max(ids) >= vocab):
            bad = [t for t in ids if not 0 <= t < vocab]
            raise InvalidParameterError(
                param, f"{param}: token ids {bad[:4]} are outside the vocabulary (size {vocab})"
            )

    def check(
        self,
        prompt_ids: Sequence[int],
        params: SamplingParams,
        where: str = "prompt",
        max_tokens_unset: bool = False,
    ) -> None:
        """Raise InvalidParameterError naming the parameter at fault (RequestRejectedError
        when the request does not fit); `where` names the one that carried the prompt
        ("prompt" or "messages"). With max_tokens_unset (the client set none, and
        params.max_tokens holds max_tokens_for's value), params.max_tokens is first cut to
        the room the prompt leaves, so such a request never gets a length error."""
        if params.logit_bias:
            self.check_token_ids(list(params.logit_bias), "logit_bias")
        n, limit = len(prompt_ids), self.max_model_len
        if n == 0:
            raise InvalidParameterError(where, "prompt is empty after tokenization")
        if n >= limit:
            raise RequestRejectedError(
                where,
                f"prompt is too long: {n} tokens, but this model's maximum context "
                f"length is {limit} tokens",
            )
        if max_tokens_unset:
            params.max_tokens = min(params.max_tokens, limit - n)
            if params.min_tokens > params.max_tokens:
                raise InvalidParameterError(
                    "min_tokens",
                    f"min_tokens: {params.min_tokens} exceeds the "
                    f"{params.max_tokens} tokens this request may generate "
                    f"({n} prompt tokens of a {limit}-token context)",
                )
        m = params.max_tokens
        if n + m > limit:
            raise RequestRejectedError(
                "max_tokens",
                f"this model's maximum context length is {limit} tokens, but "
                f"{n + m} were requested ({n} in the prompt, {m} for the "
                f"completion); reduce the prompt or max_tokens (at most "
                f"{limit - n} here)",
            )
        if self.num_blocks is not None:
            need = -(-(n + m) // self.block_size)
            if need > self.num_blocks:
                raise RequestRejectedError(
                    "max_tokens",
                    f"request needs {need} KV blocks but the KV pool has {self.num_blocks}",
                )
