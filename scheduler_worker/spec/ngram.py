"""Prompt lookup (vLLM's `ngram`, llama.cpp's lookup decoding): find the request's last n
tokens earlier in its own prompt and output, n from max_n down to min_n (3, 2: 1-token
matches drafted 9x the tokens for as few accepted on open text, docs/benchmarks.md), and
propose the k tokens that followed the latest earlier occurrence.

The per-request state is an index, per n, from each n-gram to the position right after
its latest occurrence that some token follows; it grows by the tokens added since the
last call, so a step costs O(new tokens * ngram sizes), not a scan of the context.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class NgramIndex:
    upto: int = 0  # n-grams ending before this position are indexed
    # per n: n-gram -> the position after its latest occurrence
    ends: dict[int, dict[tuple[int, ...], int]] = field(default_factory=dict)


class NgramDrafter:
    def __init__(self, min_n: int = 2, max_n: int = 3) -> None:
        if not 1 <= min_n <= max_n:
            raise ValueError(f"ngram sizes need 1 <= min_n <= max_n, got {min_n}, {max_n}")
        self.min_n, self.max_n = min_n, max_n

    def observe(self, prompt_token_ids: list[int], output_token_ids: list[int]) -> None:
        pass  # drafts from the request's own tokens only

    def propose(
        self, token_ids: list[int], state: object | None, k: int
    ) -> tuple[list[int], NgramIndex]:
        index = state if isinstance(state, NgramIndex) else NgramIndex()
        sizes = range(self.min_n, self.max_n + 1)
        for n in sizes:
            index.ends.setdefault(n, {})
        end = len(token_ids)
        # index the n-grams that end at e < end (so that a token follows each): the
        # suffix itself (ending at `end`) is the pattern, not a match
        for e in range(max(index.upto, 1), end):
            for n in sizes:
                if e >= n:
                    index.ends[n][tuple(token_ids[e - n : e])] = e
        index.upto = max(index.upto, end)
        if k <= 0:
            return [], index
        for n in reversed(sizes):
            if end < n:
                continue
            after = index.ends[n].get(tuple(token_ids[end - n :]))
            if after is not None:
                # past the end, the copy reads its own drafts (a repeat of period end - after)
                drafts: list[int] = []
                for j in range(after, after + k):
                    drafts.append(token_ids[j] if j < end else drafts[j - end])
                return drafts, index
        return [], index
