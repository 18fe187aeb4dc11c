"""Perplexity windows as llama.cpp's `llama-perplexity` cuts them, and the score of each
window from a server's echoed prompt log-probabilities.

llama-perplexity (tools/perplexity, `perplexity()`), for a context of n_ctx tokens:

    tokens = tokenize(text, add_special=True)      # BOS first if the model adds one
    chunks = len(tokens) // n_ctx                   (capped by --chunks; at least 2 n_ctx
                                                     tokens are required)
    chunk i = tokens[i*n_ctx : (i+1)*n_ctx], its first token replaced by BOS if the
              model adds one; evaluated alone (cache cleared between chunks)
    first = n_ctx // 2
    scored: the logits at positions first .. n_ctx-2, each against the next token,
            i.e. log p(token j | tokens < j) for j = first+1 .. n_ctx-1:
            n_ctx - first - 1 tokens per chunk
    PPL = exp(sum of -log p / count); +/- sqrt(var(-log p) / (count-1)) * PPL

An OpenAI completions response with `echo` and `logprobs` gives `token_logprobs`, one
entry per prompt token, the first null (nothing predicts it) and entry j = log p(token
j | tokens < j): the scored entries of a window sent as its token ids are
`token_logprobs[first+1 : n_ctx]`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Window:
    index: int
    start: int  # offset of the window's first token in the tokenized text
    token_ids: list[int]  # as sent: the first replaced by BOS where the model adds one


def plan_windows(
    tokens: list[int], n_ctx: int, num_chunks: int | None = None, bos_id: int | None = None
) -> list[Window]:
    """The windows llama-perplexity evaluates. `bos_id`: the model adds a BOS (its id)."""
    if n_ctx < 4:
        raise ValueError(f"n_ctx must be >= 4, got {n_ctx}")
    if len(tokens) < 2 * n_ctx:
        raise ValueError(
            f"the text tokenizes to {len(tokens)} tokens; perplexity with a context of "
            f"{n_ctx} needs at least {2 * n_ctx} (as llama-perplexity)"
        )
    n = len(tokens) // n_ctx
    if num_chunks is not None and num_chunks > 0:
        n = min(n, num_chunks)
    out = []
    for i in range(n):
        ids = list(tokens[i * n_ctx : (i + 1) * n_ctx])
        if bos_id is not None:
            ids[0] = bos_id
        out.append(Window(i, i * n_ctx, ids))
    return out


def scored_logprobs(token_logprobs: list[float | None], n_ctx: int) -> list[float]:
    """The entries llama-perplexity scores out of one window's echoed log-probs."""
    if len(token_logprobs) != n_ctx:
        raise ValueError(
            f"expected {n_ctx} prompt log-probs (one per window token), got "
            f"{len(token_logprobs)}: did the server add or drop tokens (BOS?)"
        )
    first = n_ctx // 2
    out = token_logprobs[first + 1 : n_ctx]
    bad = [first + 1 + k for k, v in enumerate(out) if v is None or not math.isfinite(v)]
    if bad:
        raise ValueError(f"missing or non-finite log-probs at window positions {bad[:5]}")
    return [float(v) for v in out]  # type: ignore[arg-type]


def window_logprobs(response: dict[str, Any]) -> list[float | None]:
    """`token_logprobs` of a completions response's first choice (echo + logprobs)."""
    try:
        lp = response["choices"][0]["logprobs"]
        return list(lp["token_logprobs"])
    except (KeyError, IndexError, TypeError) as e:
        raise ValueError(
            f"the response has no choices[0].logprobs.token_logprobs ({e!r}); "
            "does the server support echo with logprobs and max_tokens 0?"
        ) from e


@dataclass
class Perplexity:
    """Running totals, as llama-perplexity keeps them."""

    nll: float = 0.0
    nll2: float = 0.0
    count: int = 0
    running: list[float] = field(default_factory=list)  # PPL after each chunk

    def add(self, logprobs: list[float]) -> None:
        for v in logprobs:
            self.nll -= v
            self.nll2 += v * v
        self.count += len(logprobs)
        self.running.append(math.exp(self.nll / self.count))

    @property
    def ppl(self) -> float:
        return math.exp(self.nll / self.count)

    @property
    def stderr(self) -> float:
        """llama-perplexity's `+/-`: the standard error of the mean NLL, times PPL."""
        mean = self.nll / self.count
        var = self.nll2 / self.count - mean * mean
        if var <= 0 or self.count < 2:
            return 0.0
        return math.sqrt(var / (self.count - 1)) * self.ppl
