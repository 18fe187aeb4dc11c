"""Per-request generation parameters: one typed struct from the frontend's intake to the
engine's sampler.

The frontend builds it from a request body and validates it once (`validate`, with the
replicas' vocabulary); it travels as itself inside TokenizeRequest and GenerateRequest (a
WireStruct: an array of its fields, each checked against its annotation on decode); the
tokenizer worker settles an unset max_tokens against the prompt's length
(common.limits.settle_max_tokens), and the scheduler hands it to the engine as it came.

Torch-free so the tokenizer workers can validate without loading the engine.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any

from common.wire_struct import WireStruct

MAX_LOGPROBS = 20
MAX_STOP_STRINGS = 64  # the hard cap; servers default to server.max_stop_strings (16)
MAX_STOP_STRING_CHARS = 1024
MAX_STOP_TOKEN_IDS = 64
# structured outputs: {"kind": one of these, "spec": str, optional "whitespace_pattern": str};
# spec is the JSON schema as JSON text (json), a JSON list of strings as text (choice), a
# regex (regex), Lark text (grammar), "" (json_object). Compiled by tokenizer_worker.grammar.
STRUCTURED_KINDS = ("json", "json_object", "regex", "choice", "grammar")
MAX_STRUCTURED_SPEC_CHARS = 1 << 20
# logit_bias: {token id: bias} added to the logits before sampling (OpenAI's limits); in
# JSON its keys are decimal strings, on the wire it is an array of [id, bias] pairs
MAX_LOGIT_BIAS_ENTRIES = 300
MAX_LOGIT_BIAS = 100.0


INT64_MAX = 2**63 - 1


class InvalidParameterError(ValueError):
    """A request parameter is out of range; `param` names it (OpenAI's `param` field)."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


@dataclass
class SamplingParams(WireStruct):
    # None: the client set none; common.limits.settle_max_tokens makes it the room the
    # prompt leaves, at most max_tokens_cap, once the prompt's length is known
    max_tokens: int | None = 16
    # with max_tokens None: the endpoint's default capped by the server's limit (None: no
    # cap but the context); such a request is cut to fit, never refused for its length
    max_tokens_cap: int | None = None
    min_tokens: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # -1 (or 0) disables top-k
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    logprobs: int | None = None  # top-N logprobs per generated token
    # vLLM's: top-N logprobs at every prompt position (the prompt's own token's too), sent
    # with the first output; such a request skips the prefix cache (cached positions have
    # no logits)
    prompt_logprobs: int | None = None
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    structured: dict[str, str] | None = None  # constrained decoding (see STRUCTURED_KINDS)
    # False: no speculative decoding for this request (an extra body field, for A/B runs)
    speculative: bool = True
    # OpenAI's: added to these tokens' logits after the grammar mask, before penalties and
    # sampling (greedy rows too); the ids are checked against the vocabulary with the
    # prompt (common.limits), the reported logprobs stay the model's own
    logit_bias: dict[int, float] | None = None

    def validate(self, vocab_size: int | None = None) -> SamplingParams:
        def check(ok: bool, param: str, msg: str) -> None:
            if not ok:
                raise InvalidParameterError(param, f"{param}: {msg}")

        for name in (
            "temperature",
            "top_p",
            "min_p",
            "repetition_penalty",
            "presence_penalty",
            "frequency_penalty",
        ):
            v = getattr(self, name)
            check(isinstance(v, (int, float)) and not isinstance(v, bool), name, "must be a number")
            check(math.isfinite(v), name, f"must be finite, got {v}")
        for name in ("max_tokens", "max_tokens_cap", "min_tokens", "top_k"):
            v = getattr(self, name)
            if v is None and name.startswith("max_tokens"):
                continue  # settled later (common.limits.settle_max_tokens)
            check(isinstance(v, int) and not isinstance(v, bool), name, "must be an integer")
            # beyond any wire integer (msgpack would refuse it when the request is sent on)
            check(abs(v) <= INT64_MAX, name, f"must fit in a 64-bit integer, got {v}")
        # the flags travel on as wire bools (StepOutputs.new_requests): a truthy string here
        # would make the scheduler fail to encode its step
        for name in (
            "ignore_eos",
            "skip_special_tokens",
            "include_stop_str_in_output",
            "speculative",
        ):
            check(isinstance(getattr(self, name), bool), name, "must be a boolean")
        check(self.min_tokens >= 0, "min_tokens", f"must be >= 0, got {self.min_tokens}")
        # the one that bounds the output now: the client's, else the cap (if any)
        bound, name = (
            (self.max_tokens, "max_tokens")
            if self.max_tokens is not None
            else (self.max_tokens_cap, "max_tokens_cap")
        )
        if bound is not None:
            check(bound >= 1, name, f"must be >= 1, got {bound}")
            check(
                self.min_tokens <= bound,
                "min_tokens",
                f"must be <= {name} ({bound}), got {self.min_tokens}",
            )
        check(self.temperature >= 0.0, "temperature", f"must be >= 0, got {self.temperature}")
        check(0.0 < self.top_p <= 1.0, "top_p", f"must be in (0, 1], got {self.top_p}")
        check(self.top_k >= -1, "top_k", f"must be -1 (disabled) or >= 0, got {self.top_k}")
        check(0.0 <= self.min_p <= 1.0, "min_p", f"must be in [0, 1], got {self.min_p}")
        check(
            self.repetition_penalty > 0.0,
            "repetition_penalty",
            f"must be > 0, got {self.repetition_penalty}",
        )
        check(
            -2.0 <= self.presence_penalty <= 2.0,
            "presence_penalty",
            f"must be in [-2, 2], got {self.presence_penalty}",
        )
        check(
            -2.0 <= self.frequency_penalty <= 2.0,
            "frequency_penalty",
            f"must be in [-2, 2], got {self.frequency_penalty}",
        )
        if self.seed is not None:
            check(
                isinstance(self.seed, int)
                and not isinstance(self.seed, bool)
                and -(2**63) <= self.seed < 2**64,
                "seed",
                "must be a 64-bit integer",
            )
        check(
            isinstance(self.stop, list) and all(isinstance(s, str) and s for s in self.stop),
            "stop",
            "must be a list of non-empty strings",
        )
        check(
            len(self.stop) <= MAX_STOP_STRINGS,
            "stop",
            f"at most {MAX_STOP_STRINGS} stop strings, got {len(self.stop)}",
        )
        longest = max(map(len, self.stop), default=0)
        check(
            longest <= MAX_STOP_STRING_CHARS,
            "stop",
            f"a stop string may have at most {MAX_STOP_STRING_CHARS} characters, got {longest}",
        )
        check(
            isinstance(self.stop_token_ids, list)
            and all(
                isinstance(t, int) and not isinstance(t, bool) and t >= 0
                for t in self.stop_token_ids
            ),
            "stop_token_ids",
            "must be a list of non-negative integers",
        )
        check(
            all(t <= INT64_MAX for t in self.stop_token_ids),
            "stop_token_ids",
            "ids must fit in a 64-bit integer",
        )
        check(
            len(self.stop_token_ids) <= MAX_STOP_TOKEN_IDS,
            "stop_token_ids",
            f"at most {MAX_STOP_TOKEN_IDS} ids, got {len(self.stop_token_ids)}",
        )
        if vocab_size is not None:
            bad = [t for t in self.stop_token_ids if t >= vocab_size]
            check(
                not bad,
                "stop_token_ids",
                f"ids {bad[:4]} are outside the vocabulary (size {vocab_size})",
            )
        for name in ("logprobs", "prompt_logprobs"):
            v = getattr(self, name)
            if v is not None:
                check(
                    isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= MAX_LOGPROBS,
                    name,
                    f"must be an integer in [0, {MAX_LOGPROBS}], got {v}",
                )
        if self.structured is not None:
            check_structured(self.structured)
        if self.logit_bias is not None:
            check_logit_bias(self.logit_bias)
        return self

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SamplingParams:
        """From a request body's fields (the frontend's intake, the offline API's callers):
        an unknown name is an InvalidParameterError, logit_bias keys may be decimal
        strings as JSON carries them. Not validated: call validate()."""
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise InvalidParameterError(
                sorted(unknown)[0], f"unknown sampling parameter(s): {sorted(unknown)}"
            )
        if isinstance(data.get("logit_bias"), dict):
            data = {**data, "logit_bias": _int_keys(data["logit_bias"])}
        return cls(**data)


def _int_keys(bias: dict[Any, Any]) -> dict[Any, Any]:
    """logit_bias as JSON carries it ({"1234": -100}): its keys as ints."""
    out: dict[Any, Any] = {}
    for key, value in bias.items():
        if isinstance(key, str):
            if not (key.isascii() and key.isdigit() and len(key) <= 19):
                raise InvalidParameterError(
                    "logit_bias", f"logit_bias: keys must be token ids, got {key[:40]!r}"
                )
            key = int(key)
        out[key] = value
    return out


def check_logit_bias(bias: Any) -> None:
    """The shape of SamplingParams.logit_bias: at most MAX_LOGIT_BIAS_ENTRIES token ids
    (integers >= 0; the vocabulary is common.limits') to biases in [-100, 100]."""

    def check(ok: bool, msg: str) -> None:
        if not ok:
            raise InvalidParameterError("logit_bias", f"logit_bias: {msg}")

    check(isinstance(bias, dict), "must be a map of token ids to biases")
    check(
        len(bias) <= MAX_LOGIT_BIAS_ENTRIES,
        f"at most {MAX_LOGIT_BIAS_ENTRIES} entries, got {len(bias)}",
    )
    for t, b in bias.items():
        check(
            isinstance(t, int) and not isinstance(t, bool) and 0 <= t <= INT64_MAX,
            f"keys must be token ids, got {t!r}",
        )
        check(
            isinstance(b, (int, float))
            and not isinstance(b, bool)
            and -MAX_LOGIT_BIAS <= b <= MAX_LOGIT_BIAS,
            f"the bias of token {t} must be a number in [-100, 100], got {b!r}",
        )


def check_structured(value: Any) -> None:
    """The shape of SamplingParams.structured (its spec is compiled by the tokenizer pool)."""
    ok = (
        isinstance(value, dict)
        and value.get("kind") in STRUCTURED_KINDS
        and isinstance(value.get("spec"), str)
        and set(value) <= {"kind", "spec", "whitespace_pattern"}
        and isinstance(value.get("whitespace_pattern", ""), str)
    )
    if not ok:
        raise InvalidParameterError(
            "structured",
            f"structured: must be {{'kind': one of {list(STRUCTURED_KINDS)}, 'spec': str}} "
            "with an optional 'whitespace_pattern': str",
        )
    if len(value["spec"]) > MAX_STRUCTURED_SPEC_CHARS:
        raise InvalidParameterError(
            "structured",
            f"structured: the spec may have at most {MAX_STRUCTURED_SPEC_CHARS} characters",
        )
