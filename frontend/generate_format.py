"""/generate's response shape (the seed server's): one JSON, or the text alone as plain
chunks; the OpenAI shapes are in frontend.api.openai_format."""

from __future__ import annotations

from typing import Any

from frontend.api.openai_format import Choice, usage
from frontend.errors import APIError
from frontend.logprobs import TokenLogprob
from frontend.request_handle import Delta


class GenerateFormat:
    """/generate (the seed server's): {"text", "finish_reason", "usage"}, or the text
    alone as plain chunks."""

    media_type = "text/plain; charset=utf-8"

    def prompt_index(self, index: int) -> int:
        return 0

    def filter(self, d: Delta) -> Delta:
        return d

    def response(self, choices: list[Choice]) -> dict[str, Any]:
        c = choices[0]  # /generate has n = 1
        return {
            "text": c.text,
            "finish_reason": c.finish_reason,
            "usage": usage([c], details=False),
        }

    def stream_start(self, n: int, num_prompt_tokens: int = 0) -> list[str]:
        return []

    def stream_delta(self, d: Delta, offset: int, lps: list[TokenLogprob]) -> str:
        return d.text

    def stream_error(self, e: APIError) -> str:
        return ""  # plain text cannot carry it: the stream just ends (the server logs it)

    def stream_end(self, choices: list[Choice]) -> str:
        return ""
