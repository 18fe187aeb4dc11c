"""Response shapes: OpenAI's for completions and chat (SSE chunks or one JSON), and
/generate's (plain text chunks or one JSON).

A `Choice` accumulates one sub-request's outputs; a format turns Deltas and Choices into
a whole response, or into the parts of a stream (`stream_start`, `stream_delta` per
output, then `stream_end`, or `stream_error` when a request fails after its first output). Logprobs name tokens by the strings the detok worker decoded for them (a
token that is only part of a UTF-8 character decodes to U+FFFD and gets `bytes: null`);
where a string is missing, by "token_id:<id>", vLLM's `return_tokens_as_token_ids`
convention. Completions' `text_offset` is the offset of the step's text.
"""

from __future__ import annotations

import json
from typing import Any

from common.log import get_logger
from common.messages import WireError, unpack_ids
from frontend.errors import APIError
from frontend.request_handle import Delta

log = get_logger("frontend.responses")

# (token, logprob, [(top token, logprob), ...]) for one generated token, tokens as strings
TokenLogprob = tuple[str, float, list[tuple[str, float]]]


def dumps(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def sse(obj: Any) -> str:
    return f"data: {dumps(obj)}\n\n"


SSE_DONE = "data: [DONE]\n\n"


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
            names = entry[2] if len(entry) > 2 else None
            if not (
                isinstance(names, list)
                and len(names) == len(entry[1]) + 1
                and all(isinstance(n, str) for n in names)
            ):
                names = [token_name(t) for t in (tid, *(int(t) for t, _ in entry[1]))]
            out.append(
                (
                    names[0],
                    float(entry[0]),
                    [(name, float(v)) for name, (_, v) in zip(names[1:], entry[1])],
                )
            )
        return out
    except (WireError, TypeError, ValueError, IndexError) as e:
        log.warning("ignoring malformed logprobs: %s", e)
        return []


class Choice:
    """One sub-request's outputs so far."""

    __slots__ = (
        "index",
        "texts",
        "text_len",
        "finish_reason",
        "stop_reason",
        "num_prompt_tokens",
        "num_output_tokens",
        "logprobs",
        "offsets",
        "timings",
    )

    def __init__(self, index: int) -> None:
        self.index = index
        self.texts: list[str] = []
        self.text_len = 0
        self.finish_reason: str | None = None
        self.stop_reason: str | int | None = None
        self.num_prompt_tokens = 0
        self.num_output_tokens = 0
        self.logprobs: list[TokenLogprob] = []
        self.offsets: list[int] = []
        self.timings: dict[str, Any] | None = None

    def add(self, d: Delta, keep: bool) -> tuple[int, list[TokenLogprob]]:
        """Account for d; keep its text/logprobs when the whole response is built at the end.
        Returns (text offset before d, d's token logprobs)."""
        offset = self.text_len
        self.text_len += len(d.text)
        self.num_prompt_tokens = d.num_prompt_tokens
        self.num_output_tokens = d.num_output_tokens
        if d.finish_reason is not None:
            self.finish_reason, self.stop_reason = d.finish_reason, d.stop_reason
        if d.timings is not None:
            self.timings = d.timings
        lps = token_logprobs(d)
        if keep:
            self.texts.append(d.text)
            self.logprobs.extend(lps)
            self.offsets.extend([offset] * len(lps))
        return offset, lps

    @property
    def text(self) -> str:
        return "".join(self.texts)


def usage_of(num_prompt_tokens: int, num_output_tokens: int) -> dict[str, Any]:
    return {
        "prompt_tokens": num_prompt_tokens,
        "completion_tokens": num_output_tokens,
        "total_tokens": num_prompt_tokens + num_output_tokens,
    }


def usage(choices: list[Choice]) -> dict[str, Any]:
    prompt = max((c.num_prompt_tokens for c in choices), default=0)  # one prompt, n choices
    out = usage_of(prompt, sum(c.num_output_tokens for c in choices))
    timings = [c.timings for c in choices]
    if any(t is not None for t in timings):  # extension, only with return_timings
        out["timings"] = timings[0] if len(timings) == 1 else timings
    return out


class ResponseFormat:
    """OpenAI's shapes; a stream is server-sent events ending with [DONE]."""

    media_type = "text/event-stream"
    chunk_object = ""
    response_object = ""

    def __init__(
        self,
        id: str,
        model: str,
        created: int,
        logprobs: bool,
        include_usage: bool = False,
        continuous_usage: bool = False,
    ) -> None:
        self.id, self.model, self.created, self.want_logprobs = id, model, created, logprobs
        self.include_usage = include_usage  # stream_options.include_usage
        # stream_options.continuous_usage_stats (vLLM's): every chunk's usage is its
        # choice's so far, instead of null until the last chunk
        self.continuous_usage = continuous_usage and include_usage

    def _envelope(self, obj: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
        out = {
            "id": self.id,
            "object": obj,
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }
        if self.include_usage and obj == self.chunk_object:
            out["usage"] = None  # as OpenAI: every chunk has it, null until the last one
        return out

    def stream_start(self, n: int, num_prompt_tokens: int = 0) -> list[str]:
        chunks = self.start_chunks(n)
        if self.continuous_usage:
            for c in chunks:
                c["usage"] = usage_of(num_prompt_tokens, 0)
        return [sse(c) for c in chunks]

    def stream_delta(self, d: Delta, offset: int, lps: list[TokenLogprob]) -> str:
        if d.text or d.finish_reason is not None or lps:
            return sse(self.chunk(d, offset, lps))
        return ""

    def stream_error(self, e: APIError) -> str:
        return sse(e.body()) + SSE_DONE

    def stream_end(self, choices: list[Choice]) -> str:
        return (sse(self.usage_chunk(choices)) if self.include_usage else "") + SSE_DONE

    def start_chunks(self, n: int) -> list[dict[str, Any]]:
        return []

    def usage_chunk(self, choices: list[Choice]) -> dict[str, Any]:
        return {**self._envelope(self.chunk_object, []), "usage": usage(choices)}

    def response(self, choices: list[Choice]) -> dict[str, Any]:
        body = [self._choice(c) for c in choices]
        for entry, c in zip(body, choices):
            if c.timings is not None:
                entry["timings"] = c.timings
        return {**self._envelope(self.response_object, body), "usage": usage(choices)}

    def chunk(self, d: Delta, offset: int, lps: list[TokenLogprob]) -> dict[str, Any]:
        entry = self._chunk_choice(d, self._logprobs(lps, [offset] * len(lps)) if lps else None)
        entry["finish_reason"] = d.finish_reason
        entry["stop_reason"] = d.stop_reason
        if d.timings is not None and d.finish_reason is not None:
            entry["timings"] = d.timings
        out = self._envelope(self.chunk_object, [entry])
        if self.continuous_usage:
            out["usage"] = usage_of(d.num_prompt_tokens, d.num_output_tokens)
        return out

    def _choice(self, c: Choice) -> dict[str, Any]:
        raise NotImplementedError

    def _chunk_choice(self, d: Delta, logprobs: dict[str, Any] | None) -> dict[str, Any]:
        raise NotImplementedError

    def _logprobs(self, lps: list[TokenLogprob], offsets: list[int]) -> dict[str, Any] | None:
        raise NotImplementedError


class CompletionFormat(ResponseFormat):
    chunk_object = response_object = "text_completion"

    def _logprobs(self, lps: list[TokenLogprob], offsets: list[int]) -> dict[str, Any] | None:
        if not self.want_logprobs:
            return None
        return {
            "tokens": [t for t, _, _ in lps],
            "token_logprobs": [lp for _, lp, _ in lps],
            "top_logprobs": [dict(top) for _, _, top in lps],
            "text_offset": offsets,
        }

    def _chunk_choice(self, d: Delta, logprobs: dict[str, Any] | None) -> dict[str, Any]:
        return {"index": d.index, "text": d.text, "logprobs": logprobs}

    def _choice(self, c: Choice) -> dict[str, Any]:
        return {
            "index": c.index,
            "text": c.text,
            "logprobs": self._logprobs(c.logprobs, c.offsets),
            "finish_reason": c.finish_reason,
            "stop_reason": c.stop_reason,
        }


class ChatFormat(ResponseFormat):
    chunk_object = "chat.completion.chunk"
    response_object = "chat.completion"

    def _logprobs(self, lps: list[TokenLogprob], offsets: list[int]) -> dict[str, Any] | None:
        if not self.want_logprobs:
            return None
        return {
            "content": [
                {
                    "token": t,
                    "logprob": lp,
                    "bytes": token_bytes(t),
                    "top_logprobs": [
                        {"token": t2, "logprob": v, "bytes": token_bytes(t2)} for t2, v in top
                    ],
                }
                for t, lp, top in lps
            ]
        }

    def start_chunks(self, n: int) -> list[dict[str, Any]]:
        return [
            self._envelope(
                self.chunk_object,
                [
                    {
                        "index": i,
                        "delta": {"role": "assistant", "content": ""},
                        "logprobs": None,
                        "finish_reason": None,
                    }
                ],
            )
            for i in range(n)
        ]

    def _chunk_choice(self, d: Delta, logprobs: dict[str, Any] | None) -> dict[str, Any]:
        delta = {"content": d.text} if d.text or d.finish_reason is None else {}
        return {"index": d.index, "delta": delta, "logprobs": logprobs}

    def _choice(self, c: Choice) -> dict[str, Any]:
        return {
            "index": c.index,
            "message": {"role": "assistant", "content": c.text},
            "logprobs": self._logprobs(c.logprobs, c.offsets),
            "finish_reason": c.finish_reason,
            "stop_reason": c.stop_reason,
        }


class GenerateFormat:
    """/generate (the seed server's): {"text", "finish_reason", "usage"}, or the text
    alone as plain chunks."""

    media_type = "text/plain; charset=utf-8"

    def response(self, choices: list[Choice]) -> dict[str, Any]:
        c = choices[0]  # /generate has n = 1
        return {"text": c.text, "finish_reason": c.finish_reason, "usage": usage([c])}

    def stream_start(self, n: int, num_prompt_tokens: int = 0) -> list[str]:
        return []

    def stream_delta(self, d: Delta, offset: int, lps: list[TokenLogprob]) -> str:
        return d.text

    def stream_error(self, e: APIError) -> str:
        return ""  # plain text cannot carry it: the stream just ends (the server logs it)

    def stream_end(self, choices: list[Choice]) -> str:
        return ""
