"""What a request must fit, in one place: the vocabulary, the context length, the KV pool.

Parameter ranges are SamplingParams.validate's (once, at the frontend's intake); this
module holds the rules that depend on the prompt and on the model. The tokenizer workers
apply them, once, before a request costs the scheduler anything; the engine applies them
only in its offline API, or to a request nothing proves came through the intake
(common.auth.passed_intake). A tokenizer worker's numbers are the replicas' (the frontend
refuses one that announces others), and a replica's KV pool holds a whole context.

A request that sets no max_tokens travels with max_tokens None and the endpoint's cap
(SamplingParams.max_tokens_cap); `settle_max_tokens` makes it the room the prompt leaves,
at most the cap, once the prompt is tokenized: the one place max_tokens is decided.

Torch-free: the tokenizer workers import it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from common.sampling_params import InvalidParameterError, SamplingParams


class RequestRejectedError(InvalidParameterError):
    """A request this server can never serve: too long for the context or the KV pool."""


def settle_max_tokens(params: SamplingParams, prompt_len: int, max_model_len: int) -> int:
    """An unset max_tokens (None) becomes the room the prompt leaves in the context, at
    most params.max_tokens_cap; a client's max_tokens stays as it is (RequestLimits.check
    refuses it if it does not fit). Returns the settled max_tokens."""
    if params.max_tokens is not None:
        return params.max_tokens
    room = max_model_len - prompt_len
    cap = params.max_tokens_cap
    params.max_tokens = room if cap is None else min(cap, room)
    params.max_tokens_cap = None
    if params.min_tokens > params.max_tokens:
        raise InvalidParameterError(
            "min_tokens",
            f"min_tokens: {params.min_tokens} exceeds the {params.max_tokens} tokens this "
            f"request may generate ({prompt_len} prompt tokens of a {max_model_len}-token "
            "context)",
        )
    return params.max_tokens


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

    def check_prediction(self, ids: Sequence[int]) -> None:
        """OpenAI's `prediction`, tokenized: within the vocabulary, and no longer than the
        context (it drafts the output, which the context bounds)."""
        self.check_token_ids(ids, "prediction")
        if len(ids) > self.max_model_len:
            raise RequestRejectedError(
                "prediction",
                f"prediction is too long: {len(ids)} tokens, but this model's maximum "
                f"context length is {self.max_model_len} tokens",
            )

    def check(
        self, prompt_ids: Sequence[int], params: SamplingParams, where: str = "prompt"
    ) -> None:
        """Raise InvalidParameterError naming the parameter at fault (RequestRejectedError
        when the request does not fit); `where` names the one that carried the prompt
        ("prompt" or "messages"). An unset max_tokens is settled first
        (settle_max_tokens), so such a request never gets a length error."""
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
        m = settle_max_tokens(params, n, limit)
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
