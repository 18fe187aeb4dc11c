"""Predicted outputs (OpenAI's `prediction`): drafts from the text the client expects the
output to be, as prompt lookup does over the prompt, but over the prediction and aligned
with the output as it grows.

    prediction  [ p0 p1 p2 p3 p4 p5 p6 p7 ... ]
    output      [ o0 o1 o2 ]            o0..o2 == p0..p2: cursor 3, drafts p3..p(2+k)

The cursor starts at 0 (the output should begin as the prediction does). Each output token
either equals prediction[cursor] (the cursor moves on) or loses the alignment; a lost
alignment is found again where the output's last n tokens (n = 3, 2, 1) occur in the
prediction: the first occurrence after the last matched position (an edit changes a
piece and the rest follows as predicted), else, for n >= 2, the first anywhere; a 1-token
match only within ONE_TOKEN_REACH of the last match. Tokens are taken one by one, so the
alignment depends only on the output, never on how steps cut it.

The prediction positions matched to output tokens are OpenAI's accepted_prediction_tokens
(the prediction's tokens that appeared in the completion), each counted once; the others
are rejected_prediction_tokens.
"""

from __future__ import annotations

from bisect import bisect_right

PLACEHOLDER = -1  # request.PLACEHOLDER (a token still on the device): alignment stops there
ONE_TOKEN_REACH = 16
SIZES = (3, 2, 1)


class Prediction:
    """A request's prediction and its alignment with the request's output (Request.prediction)."""

    __slots__ = ("token_ids", "upto", "cursor", "last", "run", "matched", "num_matched", "_ends")

    def __init__(self, token_ids: list[int], num_prompt_tokens: int) -> None:
        self.token_ids = token_ids
        self.upto = num_prompt_tokens  # the request's tokens before this are aligned
        self.cursor: int | None = 0  # the prediction position the next output token should be
        self.last = -1  # the last prediction position matched
        self.run = 0  # output tokens since the last match (the tail a realignment may cover)
        self.matched = bytearray(len(token_ids))  # 1: this position appeared in the output
        self.num_matched = 0
        # per n: n-gram -> the sorted positions right after its occurrences (built when the
        # alignment is first lost: many predictions never are)
        self._ends: dict[int, dict[tuple[int, ...], list[int]]] | None = None

    @property
    def num_rejected(self) -> int:
        return len(self.token_ids) - self.num_matched

    def propose(self, token_ids: list[int], k: int) -> list[int]:
        """Up to k tokens to follow token_ids (the request's prompt and output)."""
        self.advance(token_ids)
        c = self.cursor
        if c is None or k <= 0:
            return []
        return self.token_ids[c : c + k]

    def advance(self, token_ids: list[int]) -> None:
        """Align the output tokens added since the last call."""
        pred, end = self.token_ids, len(token_ids)
        pos = self.upto
        while pos < end:
            t = token_ids[pos]
            if t == PLACEHOLDER:
                break
            c = self.cursor
            pos += 1
            if c is not None and c < len(pred) and pred[c] == t:
                self._mark(c, c + 1)
                self.cursor = c + 1
            else:
                self.run += 1
                self.cursor = self._realign(token_ids, pos)
        self.upto = pos

    def _mark(self, start: int, stop: int) -> None:
        for i in range(start, stop):
            if not self.matched[i]:
                self.matched[i] = 1
                self.num_matched += 1
        self.last, self.run = stop - 1, 0

    def _realign(self, token_ids: list[int], end: int) -> int | None:
        """The cursor after the output's tail token_ids[:end] found in the prediction, or
        None. Covers at most the tail's unmatched tokens (self.run)."""
        ends = self._ends if self._ends is not None else self._index()
        for n in SIZES:
            if n > self.run:
                continue
            after = ends[n].get(tuple(token_ids[end - n : end]))
            if not after:
                continue
            i = bisect_right(after, self.last + n)  # occurrences starting after the last match
            if i < len(after) and (n > 1 or after[i] - self.last <= ONE_TOKEN_REACH + 1):
                e = after[i]
            elif n > 1:
                e = after[0]
            else:
                continue
            self._mark(e - n, e)
            return e
        return None

    def _index(self) -> dict[int, dict[tuple[int, ...], list[int]]]:
        pred = self.token_ids
        ends: dict[int, dict[tuple[int, ...], list[int]]] = {n: {} for n in SIZES}
        for n in SIZES:
            index = ends[n]
            for e in range(n, len(pred) + 1):
                index.setdefault(tuple(pred[e - n : e]), []).append(e)
        self._ends = ends
        return ends
