"""Suffix drafts (SuffixDecoding, Oliaro et al. 2024, arXiv 2411.04975; vLLM's `suffix`):
the continuation of the longest suffix of a request's tokens found (a) earlier in its own
prompt and output and (b) in a bounded store of recent requests' outputs, shared by every
request of the scheduler process. Where the match occurred more than once, each drafted
token is the one most of those occurrences continue with; the draft stops once the product
of those shares (the estimate that the whole draft is right) falls under `min_prob`, and
at `factor` x the match's length: a short or ambiguous match drafts little.

    SuffixIndex     token segments and, for each context of SIZES tokens in them, the
                    positions right after its latest occurrences (at most PER_KEY)
    own index       a request's prompt and output: one segment that grows with it
                    (Request.draft_state), indexed by the tokens added since its last call
    store           one segment per finished request (its output and the prompt's last
                    PROMPT_TAIL tokens, so that an output's start is found after the chat
                    template's header); past `store_tokens` the oldest segments go

A position is global: segment i holds positions bases[i] .. bases[i] + len - 1, and bases
only grow. So an index list (ascending) loses an evicted segment's positions from its
front, and the store's memory stays within its token budget:

    num_tokens <= store_tokens      index entries <= len(SIZES) * num_tokens

Lookup: the longest SIZES context of the suffix with occurrences, each occurrence's true
match length counted back (up to MAX_DEPTH tokens; this also drops hash collisions), and
the longest of those (the deepest node of a suffix tree) vote token by token.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence

SIZES = (2, 3, 4, 8, 16)  # context lengths indexed (1-token matches draft noise)
MAX_DEPTH = 32  # a match counts back at most this many tokens
PER_KEY = 16  # occurrences kept per context, the latest
PROMPT_TAIL = 16  # a stored request's prompt tokens before its output
STORE_TOKENS = 1 << 15  # the shared store's budget, in tokens

Occurrence = tuple[list[int], int]  # (a segment's tokens, the index after the match)


class SuffixIndex:
    def __init__(self) -> None:
        self.segments: list[list[int]] = []
        self.bases: list[int] = []  # ascending: segment i's first position
        self.next_base = 0
        self.num_tokens = 0
        # per size: hash of a context -> the position after it (an int while it occurred
        # once, else a list of the latest, ascending)
        self.index: dict[int, dict[int, int | list[int]]] = {n: {} for n in SIZES}

    @property
    def num_entries(self) -> int:
        return sum(len(d) for d in self.index.values())

    def open(self) -> None:
        """Start a new segment (the previous one takes no more tokens)."""
        self.segments.append([])
        self.bases.append(self.next_base)

    def extend(self, tokens: Sequence[int]) -> None:
        """Append tokens to the newest segment; index each context that now has a token
        after it (the segment's last token starts no continuation yet)."""
        seg, base = self.segments[-1], self.bases[-1]
        start = len(seg)
        seg.extend(tokens)
        self.next_base += len(tokens)
        self.num_tokens += len(tokens)
        index = self.index
        for e in range(max(start, 1), len(seg)):
            for n in SIZES:
                if e < n:
                    break
                d, key, pos = index[n], hash(tuple(seg[e - n : e])), base + e
                at = d.get(key)
                if at is None:
                    d[key] = pos
                elif isinstance(at, int):
                    d[key] = [at, pos]
                else:
                    at.append(pos)
                    if len(at) > PER_KEY:
                        del at[0]

    def evict_oldest(self) -> None:
        """Drop the oldest segment and its positions (each list's front: they are the
        smallest there, every older segment being gone already)."""
        seg, base = self.segments.pop(0), self.bases.pop(0)
        end = base + len(seg)
        self.num_tokens -= len(seg)
        for e in range(1, len(seg)):
            for n in SIZES:
                if e < n:
                    break
                d, key = self.index[n], hash(tuple(seg[e - n : e]))
                at = d.get(key)
                if at is None:  # dropped past PER_KEY, with its key already
                    continue
                if isinstance(at, int):
                    if at < end:
                        del d[key]
                    continue
                while at and at[0] < end:
                    del at[0]
                if len(at) == 1:
                    d[key] = at[0]
                elif not at:
                    del d[key]

    def match(self, context: Sequence[int]) -> tuple[int, list[Occurrence]]:
        """The longest suffix of context held here: its length and its occurrences, the
        latest first; (0, []) if none of SIZES[0] tokens or more."""
        for n in reversed(SIZES):
            if len(context) < n:
                continue
            at = self.index[n].get(hash(tuple(context[-n:])))
            if at is None:
                continue
            best, found = 0, []
            for pos in reversed(at) if isinstance(at, list) else (at,):
                i = bisect_right(self.bases, pos) - 1
                seg, e = self.segments[i], pos - self.bases[i]
                depth, most = 0, min(MAX_DEPTH, e, len(context))
                while depth < most and seg[e - 1 - depth] == context[-1 - depth]:
                    depth += 1
                if depth < n:  # another context with the same hash
                    continue
                if depth > best:
                    best, found = depth, [(seg, e)]
                elif depth == best:
                    found.append((seg, e))
            if found:
                return best, found
        return 0, []


def continuation(
    found: list[Occurrence], limit: int, min_prob: float, open_end: bool
) -> tuple[list[int], float]:
    """Up to `limit` tokens after the occurrences, each the one most of those still
    agreeing continue with (a tie: the latest's), while the product of the shares stays
    >= min_prob; and the draft's expected number of accepted tokens (the sum of those
    products). `open_end`: the segment is the context itself, whose next tokens past its
    end are the draft's own (a repeat reads its copy, as the ngram drafter does)."""
    drafts: list[int] = []
    prob, expected = 1.0, 0.0
    while len(drafts) < limit and found:
        votes: dict[int, list[Occurrence]] = {}
        for seg, e in found:
            q = e + len(drafts)
            if q < len(seg):
                votes.setdefault(seg[q], []).append((seg, e))
            elif open_end and q - len(seg) < len(drafts):
                votes.setdefault(drafts[q - len(seg)], []).append((seg, e))
        if not votes:
            break
        token, agree = max(votes.items(), key=lambda kv: len(kv[1]))  # first max: latest
        prob *= len(agree) / sum(map(len, votes.values()))
        if prob < min_prob:
            break
        drafts.append(token)
        expected += prob
        found = agree
    return drafts, expected


class SuffixDrafter:
    def __init__(
        self,
        store_tokens: int = STORE_TOKENS,
        min_prob: float = 0.1,
        factor: float = 1.0,
    ) -> None:
        if store_tokens < 0 or not 0.0 < min_prob <= 1.0 or factor <= 0:
            raise ValueError(
                f"suffix drafter needs store_tokens >= 0, 0 < min_prob <= 1, factor > 0; got "
                f"{store_tokens}, {min_prob}, {factor}"
            )
        self.store = SuffixIndex()
        self.store_tokens = store_tokens
        self.min_prob, self.factor = min_prob, factor

    def observe(self, prompt_token_ids: Sequence[int], output_token_ids: Sequence[int]) -> None:
        """A finished request's tokens into the store (its output up to a placeholder an
        abort left, after its prompt's last PROMPT_TAIL tokens), the oldest evicted."""
        output = list(output_token_ids)
        if any(t < 0 for t in output):
            output = output[: next(i for i, t in enumerate(output) if t < 0)]
        if not output or self.store_tokens == 0:
            return
        tokens = [*prompt_token_ids[-PROMPT_TAIL:], *output][-self.store_tokens :]
        while self.store.segments and self.store.num_tokens + len(tokens) > self.store_tokens:
            self.store.evict_oldest()
        self.store.open()
        self.store.extend(tokens)

    def propose(
        self, token_ids: list[int], state: object | None, k: int
    ) -> tuple[list[int], SuffixIndex]:
        own = state if isinstance(state, SuffixIndex) else None
        if own is None:
            own = SuffixIndex()
            own.open()
        own.extend(token_ids[own.num_tokens :])
        if k <= 0:
            return [], own
        best: tuple[list[int], float] = ([], 0.0)
        for index in (own, self.store):
            depth, found = index.match(token_ids)
            if not found:
                continue
            limit = min(k, int(self.factor * depth))
            drafts, expected = continuation(found, limit, self.min_prob, index is own)
            if expected > best[1]:
                best = (drafts, expected)
        return best[0], own
