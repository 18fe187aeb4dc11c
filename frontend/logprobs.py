"""Log-probabilities as the detok worker sends them, turned into named tokens for the
response formats (frontend.api.openai_format).

An entry per token is [logprob, [[top id, logprob], ...], [token str, top strs...]?]; the
third item is the detok's decoded strings. Where it is missing or malformed, tokens are
named "token_id:<id>" (vLLM's `return_tokens_as_token_ids` convention).

A logprob that is not a finite number (-inf: a token the model's logits rule out; NaN or
+inf: logits that overflowed, e.g. float16) goes out as -9999.0, as OpenAI's API and vLLM
send an impossible token's: JSON has no infinities, so a non-streaming response would fail
to render (a 500) and a stream would carry `-Infinity`, which strict JSON parsers refuse.
"""

from __future__ import annotations

import math
from typing import Any

from common.log import get_logger
from common.messages import WireError, unpack_ids
from frontend.request_handle import Delta

log = get_logger("frontend.logprobs")

# (token, logprob, [(top token, logprob), ...]) for one token, tokens as strings
TokenLogprob = tuple[str, float, list[tuple[str, float]]]
FLOOR = -9999.0  # what a logprob that is not a finite number is sent as


def logprob_value(v: Any) -> float:
    """float(v), or FLOOR where that is not finite (-inf, +inf, NaN) or below FLOOR."""
    f = float(v)
    return f if math.isfinite(f) and f > FLOOR else FLOOR


def _names(entry: list[Any], num_top: int) -> list[str] | None:
    """The entry's decoded strings (the token's, then its top ones), or None when the
    detok sent none or they do not fit the entry."""
    names = entry[2] if len(entry) > 2 else None
    if (
        isinstance(names, list)
        and len(names) == num_top + 1
        and all(isinstance(n, str) for n in names)
    ):
        return names
    return None


def token_name(token_id: int) -> str:
    return f"token_id:{token_id}"


def token_bytes(token: str) -> list[int] | None:
    if "\ufffd" in token or token.startswith("token_id:"):
        return None  # part of a character, or no string: its bytes are not known here
    return list(token.encode("utf-8"))


def token_logprobs(d: Delta) -> list[TokenLogprob]:
    """Per new token: [logprob, [[top id, logprob], ...], [token str, top strs...]?]."""
    if not d.logprobs:
        return []
    try:
        out = []
        for tid, entry in zip(unpack_ids(d.token_ids), d.logprobs):
            names = _names(entry, len(entry[1])) or [
                token_name(t) for t in (tid, *(int(t) for t, _ in entry[1]))
            ]
            out.append(
                (
                    names[0],
                    logprob_value(entry[0]),
                    [(name, logprob_value(v)) for name, (_, v) in zip(names[1:], entry[1])],
                )
            )
        return out
    except (WireError, TypeError, ValueError, IndexError) as e:
        log.warning("ignoring malformed logprobs: %s", e)
        return []


def prompt_token_logprobs(d: Delta) -> list[TokenLogprob | None]:
    """The prompt logprobs a first output carries (SamplingParams.prompt_logprobs), per
    prompt token; the first token's entry is None (it has no logprob)."""
    entries = d.prompt_logprobs
    if not entries:
        return []
    try:
        out: list[TokenLogprob | None] = []
        for entry in entries:
            if entry[0] is None:
                out.append(None)
                continue
            tops = entry[1]
            names = _names(entry, len(tops)) or ["", *(token_name(int(t)) for t, _ in tops)]
            tops_named = [(n, logprob_value(v)) for n, (_, v) in zip(names[1:], tops)]
            out.append((names[0], logprob_value(entry[0]), tops_named))
        return out
    except (TypeError, ValueError, IndexError) as e:
        log.warning("ignoring malformed prompt logprobs: %s", e)
        return []


def prompt_token_names(d: Delta) -> list[str]:
    """The prompt tokens' strings (the detok's), for echo's `tokens`."""
    try:
        return [
            e[2][0] if len(e) > 2 and isinstance(e[2][0], str) else ""
            for e in d.prompt_logprobs or []
        ]
    except (TypeError, IndexError):
        return []
