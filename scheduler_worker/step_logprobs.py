"""A step's logprobs on the host: a row's as lists (TokenLogprobs), or all the step's rows
kept as the device gave them (StepLogprobs) until the message packs them.

The usual decode row's output (resolve_rows.py) carries a RowLogprobs, a reference into
its step's StepLogprobs, and the message packs every such row from the arrays at once
(StepLogprobs.pack: the bytes of pack_token_logprobs, common/messages/scheduler_detok.py).
Each logprobs row's lists, built from the host copies and read back out to be packed, cost
the chat mix's step 30-70 µs at 256 rows, 32 of them with five alternatives
(docs/benchmarks.md, "A step's logprobs packed from its arrays"). A row anything else
reads (the engine's rows apart, LLMEngine.step, the message's list form) takes its
TokenLogprobs (`token_logprobs`), the same values.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import NamedTuple, overload

import numpy as np


class TokenLogprobs(NamedTuple):
    """A tuple: a step's are built in C (DeviceSample.result), no frame a row."""

    token_id: int
    logprob: float
    top_ids: list[int]
    top_logprobs: list[float]


class StepLogprobs:
    """The k rows of a step's sample that asked for logprobs, on the host: `rows`, their
    rows in the step; `tokens`, every row's sampled token; `sampled` [k], each one's
    token's logprob; `top_ids` / `top_logprobs` [k, n] (None where n is 0), row i's first
    num_top[i] its top-N (the rest: another row's larger N)."""

    __slots__ = ("tokens", "rows", "sampled", "top_ids", "top_logprobs", "num_top")

    def __init__(
        self,
        tokens: list[int],
        rows: list[int],
        sampled: np.ndarray,
        top_ids: np.ndarray | None,
        top_logprobs: np.ndarray | None,
        num_top: list[int],
    ) -> None:
        self.tokens, self.rows, self.num_top = tokens, rows, num_top
        self.sampled, self.top_ids, self.top_logprobs = sampled, top_ids, top_logprobs

    def row(self, i: int) -> TokenLogprobs:
        """Logprobs row i (of k) as lists, as DeviceSample.result builds them."""
        n = self.num_top[i]
        ids = [] if self.top_ids is None else self.top_ids[i, :n].tolist()
        lps = [] if self.top_logprobs is None else self.top_logprobs[i, :n].tolist()
        return TokenLogprobs(self.tokens[self.rows[i]], float(self.sampled[i]), ids, lps)

    def pack(self, at: Sequence[int], idx: Sequence[int]) -> bytes:
        """StepOutputs.token_logprobs for message rows `at` (increasing), each one's
        logprobs this block's row idx[i]: pack_token_logprobs' bytes, from the arrays (a
        top id is a vocabulary index: it fits int32). Each numpy call costs ~1 µs: the
        usual message (the block's every row in order, one N) takes the arrays whole."""
        k, num_top = len(idx), self.num_top
        sel = None if list(idx) == list(range(len(num_top))) else np.asarray(idx, dtype=np.int64)
        counts = num_top if sel is None else [num_top[i] for i in idx]
        parts = [struct.pack(f"<I{k}i{k}i", k, *at, *counts)]
        parts.append((self.sampled if sel is None else self.sampled[sel]).astype("<f8").tobytes())
        if self.top_ids is not None and self.top_logprobs is not None:
            ids, lps = self.top_ids, self.top_logprobs
            if sel is not None:
                ids, lps = ids[sel], lps[sel]
            if counts.count(ids.shape[1]) != k:  # rows of a smaller N: their first N
                keep = np.arange(ids.shape[1]) < np.asarray(counts)[:, None]
                ids, lps = ids[keep], lps[keep]
            parts += [ids.astype("<i4").tobytes(), lps.astype("<f8").tobytes()]
        return b"".join(parts)


class RowLogprobs(NamedTuple):
    """Row i of a step's StepLogprobs: what the usual decode row's output carries."""

    block: StepLogprobs
    i: int


@overload
def token_logprobs(lp: TokenLogprobs | RowLogprobs) -> TokenLogprobs: ...
@overload
def token_logprobs(lp: None) -> None: ...
def token_logprobs(lp: TokenLogprobs | RowLogprobs | None) -> TokenLogprobs | None:
    """A row's logprobs as TokenLogprobs (a RowLogprobs made into its lists)."""
    return lp.block.row(lp.i) if type(lp) is RowLogprobs else lp  # type: ignore[return-value]
