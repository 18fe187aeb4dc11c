"""Response shapes: OpenAI's for completions and chat (SSE chunks or one JSON);
/generate's is in frontend.generate_format.

A `Choice` accumulates one sub-request's outputs; a format turns Deltas and Choices into
a whole response, or into the parts of a stream (`stream_start`, `stream_delta` per
output, then `stream_end`, or `stream_error` when a request fails after its first
output). Logprobs name tokens by the strings the detok worker decoded for them
(frontend.logprobs; a token that is only part of a UTF-8 character decodes to U+FFFD and
gets `bytes: null`). Completions' `text_offset` is the offset of the step's text.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from frontend.api.openai_usage import usage, usage_of
from frontend.errors import APIError
from frontend.logprobs import (
    TokenLogprob,
    prompt_token_logprobs,
    prompt_token_names,
    token_bytes,
    token_logprobs,
)
from frontend.reasoning import ReasoningSplit
from frontend.request_handle import Delta


def dumps(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def sse(obj: Any) -> str:
    return f"data: {dumps(obj)}\n\n"


SSE_DONE = "data: [DONE]\n\n"


class Choice:
    """One sub-request's outputs so far."""

    __slots__ = (
        "index",
        "prompt_index",
        "prompt_logprobs",
        "prompt_tokens",
        "texts",
        "reasoning_texts",
        "num_reasoning_tokens",
        "text_len",
        "finish_reason",
        "stop_reason",
        "num_prompt_tokens",
        "num_output_tokens",
        "num_cached_tokens",
        "logprobs",
        "offsets",
        "timings",
        "prediction",
    )

    def __init__(self, index: int, prompt_index: int = 0) -> None:
        self.index = index
        self.prompt_index = prompt_index  # a batch of prompts: which one it answers
        self.prompt_logprobs: list[TokenLogprob | None] = []  # echo with logprobs
        self.prompt_tokens: list[str] = []
        self.texts: list[str] = []
        self.reasoning_texts: list[str] = []  # with a reasoning parser (frontend.reasoning)
        self.num_reasoning_tokens = 0
        self.text_len = 0
        self.finish_reason: str | None = None
        self.stop_reason: str | int | None = None
        self.num_prompt_tokens = 0
        self.num_output_tokens = 0
        self.num_cached_tokens = 0  # known with the finishing output
        self.logprobs: list[TokenLogprob] = []
        self.offsets: list[int] = []
        self.timings: dict[str, Any] | None = None
        self.prediction: tuple[int, int] | None = None  # (accepted, rejected), at the finish

    def add(self, d: Delta, keep: bool) -> tuple[int, list[TokenLogprob]]:
        """Account for d; keep its text/logprobs when the whole response is built at the end.
        Returns (text offset before d, d's token logprobs)."""
        offset = self.text_len
        self.text_len += len(d.text)
        self.num_prompt_tokens = d.num_prompt_tokens
        self.num_output_tokens = d.num_output_tokens
        self.num_reasoning_tokens = d.num_reasoning_tokens
        if d.finish_reason is not None:
            self.finish_reason, self.stop_reason = d.finish_reason, d.stop_reason
            self.num_cached_tokens = d.num_cached_tokens
        if d.timings is not None:
            self.timings = d.timings
        if d.prediction is not None:
            self.prediction = d.prediction
        lps = token_logprobs(d)
        if d.prompt_logprobs:
            self.prompt_logprobs = prompt_token_logprobs(d)
            self.prompt_tokens = prompt_token_names(d)
        if keep:
            self.texts.append(d.text)
            self.reasoning_texts.append(d.reasoning)
            self.logprobs.extend(lps)
            self.offsets.extend([offset] * len(lps))
        return offset, lps

    @property
    def text(self) -> str:
        return "".join(self.texts)


class ResponseFormat:
    """OpenAI's shapes; a stream is server-sent events ending with [DONE]."""

    media_type = "text/event-stream"
    chunk_object = ""
    response_object = ""
    reasoning: ReasoningSplit | None = None  # chat with --reasoning-parser

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

    def prompt_index(self, index: int) -> int:
        """Which prompt choice `index` answers (a batch of prompts: n choices each)."""
        return 0

    def filter(self, d: Delta) -> Delta:
        """An output as the response shows it (CompletionFormat: echo without generating;
        chat: its reasoning split off)."""
        return d if self.reasoning is None else self.reasoning(d)

    def stream_start(self, n: int, num_prompt_tokens: int = 0) -> list[str]:
        chunks = self.start_chunks(n)
        if self.continuous_usage:
            for c in chunks:
                c["usage"] = usage_of(num_prompt_tokens, 0)
        return [sse(c) for c in chunks]

    def stream_delta(self, d: Delta, offset: int, lps: list[TokenLogprob]) -> str:
        if d.text or d.reasoning or d.finish_reason is not None or lps:
            return sse(self.chunk(d, offset, lps))
        return ""

    def stream_error(self, e: APIError) -> str:
        return sse(e.body()) + SSE_DONE

    def stream_end(self, choices: list[Choice]) -> str:
        return (sse(self.usage_chunk(choices)) if self.include_usage else "") + SSE_DONE

    def start_chunks(self, n: int) -> list[dict[str, Any]]:
        return []

    def usage_chunk(self, choices: list[Choice]) -> dict[str, Any]:
        reasoning = self.reasoning is not None
        return {**self._envelope(self.chunk_object, []), "usage": usage(choices, True, reasoning)}

    def response(self, choices: list[Choice]) -> dict[str, Any]:
        body = [self._choice(c) for c in choices]
        for entry, c in zip(body, choices):
            if c.timings is not None:
                entry["timings"] = c.timings
        reasoning = self.reasoning is not None
        return {
            **self._envelope(self.response_object, body),
            "usage": usage(choices, True, reasoning),
        }

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
    """OpenAI's (and vLLM's) completions. `echo`: each prompt's text, put before its
    choices' text, with (given logprobs) the prompt tokens' logprobs before the generated
    ones, the first null; `echo_only` (max_tokens 0): the generated token is dropped."""

    chunk_object = response_object = "text_completion"

    def __init__(
        self,
        *args: Any,
        echo: list[str] | None = None,
        echo_only: bool = False,
        n: int = 1,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.echo, self.echo_only, self.n = echo, echo_only, n
        self._echoed: set[int] = set()  # streamed choices whose prompt went out already

    def prompt_index(self, index: int) -> int:
        return index // self.n

    def filter(self, d: Delta) -> Delta:
        if not self.echo_only:
            return d
        return dataclasses.replace(d, text="", num_output_tokens=0, token_ids=b"", logprobs=None)

    def _echo(self, c: Choice) -> tuple[str, list[TokenLogprob | None], list[int]]:
        """(prompt text, prompt logprobs, their text offsets) for choice c."""
        if self.echo is None:
            return "", [], []
        offsets, at = [], 0
        for name in c.prompt_tokens:
            offsets.append(at)
            at += len(name)
        return self.echo[c.prompt_index], c.prompt_logprobs, offsets

    def _logprobs(
        self,
        lps: list[TokenLogprob],
        offsets: list[int],
        prompt: list[TokenLogprob | None] | None = None,
        prompt_tokens: list[str] | None = None,
        prompt_offsets: list[int] | None = None,
    ) -> dict[str, Any] | None:
        if not self.want_logprobs:
            return None
        prompt = prompt or []
        names = prompt_tokens or [""] * len(prompt)
        return {
            "tokens": [e[0] if e else t for e, t in zip(prompt, names)] + [t for t, _, _ in lps],
            "token_logprobs": [e[1] if e else None for e in prompt] + [lp for _, lp, _ in lps],
            "top_logprobs": [dict(e[2]) if e else None for e in prompt]
            + [dict(top) for _, _, top in lps],
            "text_offset": (prompt_offsets or [0] * len(prompt)) + offsets,
        }

    def chunk(self, d: Delta, offset: int, lps: list[TokenLogprob]) -> dict[str, Any]:
        out = super().chunk(d, offset, lps)
        if self.echo is not None and d.index not in self._echoed:  # its first chunk
            self._echoed.add(d.index)
            c = Choice(d.index, self.prompt_index(d.index))
            c.add(d, keep=False)
            text, plps, poffsets = self._echo(c)
            entry = out["choices"][0]
            entry["text"] = text + entry["text"]
            if self.want_logprobs:
                shifted = [o + len(text) for o in [offset] * len(lps)]
                entry["logprobs"] = self._logprobs(lps, shifted, plps, c.prompt_tokens, poffsets)
        elif self.echo is not None and entry_logprobs(out) is not None:
            shift = len(self.echo[self.prompt_index(d.index)])
            out["choices"][0]["logprobs"]["text_offset"] = [
                o + shift for o in out["choices"][0]["logprobs"]["text_offset"]
            ]
        return out

    def stream_delta(self, d: Delta, offset: int, lps: list[TokenLogprob]) -> str:
        if self.echo is not None and d.index not in self._echoed:
            return sse(self.chunk(d, offset, lps))  # the prompt's text, even with no new text
        return super().stream_delta(d, offset, lps)

    def _chunk_choice(self, d: Delta, logprobs: dict[str, Any] | None) -> dict[str, Any]:
        return {"index": d.index, "text": d.text, "logprobs": logprobs}

    def _choice(self, c: Choice) -> dict[str, Any]:
        text, plps, poffsets = self._echo(c)
        offsets = [o + len(text) for o in c.offsets]
        return {
            "index": c.index,
            "text": text + c.text,
            "logprobs": self._logprobs(c.logprobs, offsets, plps, c.prompt_tokens, poffsets),
            "finish_reason": c.finish_reason,
            "stop_reason": c.stop_reason,
        }


def entry_logprobs(chunk: dict[str, Any]) -> dict[str, Any] | None:
    return chunk["choices"][0].get("logprobs")


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
        delta = {"reasoning_content": d.reasoning} if d.reasoning else {}
        if d.text or (d.finish_reason is None and not d.reasoning):
            delta["content"] = d.text
        return {"index": d.index, "delta": delta, "logprobs": logprobs}

    def _choice(self, c: Choice) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": c.text}
        if self.reasoning is not None:  # vLLM's field; null when there was none
            message["reasoning_content"] = "".join(c.reasoning_texts) or None
        return {
            "index": c.index,
            "message": message,
            "logprobs": self._logprobs(c.logprobs, c.offsets),
            "finish_reason": c.finish_reason,
            "stop_reason": c.stop_reason,
        }
