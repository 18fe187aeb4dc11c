"""Penalty state kept per slot on the device: each penalized slot's output-token counts
(float32 [entries, vocab]: whole numbers, exact below 2**24, read without a conversion) and the tokens of its prompt (bool), so a step's penalties cost
the host the tokens that are new since the last step, not the row's whole context
(docs/benchmarks.md, "Penalty counts per slot"), as vLLM v1 keeps its batch's output token
counts on the device.

Entries are a small pool mapped from the sampler's slots (Request.slot), made for the
slots whose rows carry a penalty only: a batch with no penalty allocates nothing, and the
pool grows to the most penalized slots one step has seen. An entry is
filled when a request's row first reaches it (its prompt and the outputs it already has:
a join, a resume after preemption, a prefix-cache hit, an n > 1 fork), then gains the
row's newly resolved outputs each step. What is not resolved on the host stays out of
it and is added to the step's own copy only: the token in flight (read from the step in
flight's tokens, on the device) and drafts (rejected ones leave no trace).

Where the device's one op counts the tokens in flight into the pool itself (its flags'
commit, penalties._penalize_in_one_op), a row's token in flight is counted once, on the
device, the step it is read, and never sent by the host: most steps then send the device
nothing (gather's `commit`).

Invariant: counts[e] holds the first counted[e] outputs of owner[e] (the request's own
output list, compared by identity) and seen[e] its prompt; a slot's entry whose owner is
not the row's (a new request in the slot) is reset before it is read. Placeholders
(-1) are a suffix of a request's outputs (they resolve in order), so the resolved prefix
only grows while the request runs; a committed token in flight is counted at its
placeholder, which resolves to that token (the step's sampled one). A request whose
outputs are cut below what is counted (its placeholder dropped) is counted again.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain
from typing import NamedTuple

import numpy as np
import torch

from scheduler_worker.backends.device import to_device
from scheduler_worker.backends.int_columns import int64_array


def flat_index(
    seqs: Sequence[Sequence[int]], vocab: int, entries: Sequence[int] | None = None
) -> np.ndarray:
    """row * vocab + token id for every token (0 <= id < vocab) of every sequence, the
    rows `entries` (default 0, 1, ...); a placeholder (-1) is left out."""
    lens = np.fromiter(map(len, seqs), dtype=np.int64, count=len(seqs))
    ids = np.fromiter(chain.from_iterable(seqs), dtype=np.int64, count=int(lens.sum()))
    rows = np.arange(len(seqs)) if entries is None else np.asarray(entries, dtype=np.int64)
    at = np.repeat(rows.astype(np.int64, copy=False), lens)
    keep = (ids >= 0) & (ids < vocab)
    return at[keep] * vocab + ids[keep]


class PenaltyCounts:
    def __init__(self, vocab: int = 0) -> None:
        self.vocab = vocab
        self.counts: torch.Tensor | None = None  # float32 [entries, vocab]: outputs counted
        self.seen: torch.Tensor | None = None  # bool [entries, vocab]: the prompt's tokens
        self.entry: dict[int, int] = {}  # slot -> its entry
        self.slot: list[int] = []  # entry -> its slot (-1: free)
        self.owner: list[Sequence[int] | None] = []  # entry -> its request's outputs
        self.prompt: list[Sequence[int] | None] = []
        self.counted: list[int] = []
        self.stamp: list[int] = []  # the call that last read the entry
        self.calls = 0

    @property
    def num_entries(self) -> int:
        return len(self.slot)

    def _take(self, slot: int, device: torch.device) -> int:
        """An entry for slot: a free one, else one this call has not read (its slot's
        request re-fills it if it comes back), else a new one (the pool doubles)."""
        now = self.calls
        e = next((e for e, t in enumerate(self.stamp) if t != now), len(self.slot))
        if e < len(self.slot):
            if self.slot[e] >= 0:
                del self.entry[self.slot[e]]
        else:
            grow = max(e, 1)
            zeros = torch.zeros(grow, self.vocab, dtype=torch.float32, device=device)
            old_c, old_s = self.counts, self.seen
            self.counts = zeros if old_c is None else torch.cat([old_c, zeros])
            falses = torch.zeros(grow, self.vocab, dtype=torch.bool, device=device)
            self.seen = falses if old_s is None else torch.cat([old_s, falses])
            self.slot += [-1] * grow
            self.owner += [None] * grow
            self.prompt += [None] * grow
            self.counted += [0] * grow
            self.stamp += [-1] * grow
        self.entry[slot] = e
        self.slot[e] = slot
        return e

    def gather(
        self, rows: Sequence, vocab: int, device: torch.device, commit: bool = False
    ) -> Gathered | None:
        """The rows' (SampledRow) entries, brought up to their resolved outputs; None where
        a row has no slot (the others' entries brought up all the same). commit: the
        caller's op will add each row's token in flight to its entry (penalize_rows' flags
        & 8) unless a row has drafts; granted where each such row's placeholder is its
        only one and no entry is read twice (a verify chunk's), and then counted from this
        call on."""
        if vocab != self.vocab or (self.counts is not None and self.counts.device != device):
            self.__dict__.update(PenaltyCounts(vocab).__dict__)  # a new vocab or device
        self.calls += 1
        calls, joined, prompts, grown, news, at = self.calls, [], [], [], [], []
        pend: list[int] = []
        flying: list[int] = []  # the entries whose token in flight the op commits
        one_at: list[int] = []  # the entries gaining one output (most, most steps), and it
        one_id: list[int] = []
        # the lists as locals (_take extends them in place): a row's lookups are LOAD_FASTs
        entry, stamp, owner, prompt_of, counted = (
            self.entry,
            self.stamp,
            self.owner,
            self.prompt,
            self.counted,
        )
        drafted = missing = False
        for r in rows:
            slot = r.slot
            if slot < 0:
                missing = True
                continue
            e = entry.get(slot, -1)
            outs = r.output_token_ids
            p = r.pending_row
            pend.append(p)
            if r.draft_token_ids:
                drafted = True
            if e >= 0 and stamp[e] == calls:  # a verify chunk's later position
                at.append(e)
                commit = False
                continue
            size = n = len(outs)  # its resolved outputs: without the trailing placeholders
            while n and outs[n - 1] < 0:
                n -= 1
            prompt = r.prompt_token_ids
            if (  # a new request in the slot; or its outputs cut (never while it runs)
                e < 0 or owner[e] is not outs or prompt_of[e] is not prompt or n < counted[e]
            ):
                e = e if e >= 0 else self._take(slot, device)
                owner[e], prompt_of[e], counted[e] = outs, prompt, 0
                joined.append(e)
                prompts.append(prompt)
            if n == counted[e] + 1:
                one_at.append(e)
                one_id.append(outs[n - 1])
                counted[e] = n
            elif n > counted[e]:
                grown.append(e)
                news.append(outs[counted[e] : n])
                counted[e] = n
            stamp[e] = calls
            at.append(e)
            if p >= 0:
                if size == n + 1:
                    flying.append(e)
                else:  # never while overlapped (one step in flight): the op counts apart
                    commit = False
        commit = commit and not drafted and not missing
        if commit:
            for e in flying:  # its placeholder counted: the op adds its token
                counted[e] += 1
        counts, seen = self.counts, self.seen
        if counts is None or seen is None:  # no row with a slot: no entry taken
            return None
        if joined:
            reset = to_device(torch.tensor(joined), device)
            counts.index_fill_(0, reset, 0)
            seen.index_fill_(0, reset, False)
            flat = torch.from_numpy(flat_index(prompts, vocab, joined))
            seen.view(-1).index_fill_(0, to_device(flat, device), True)
        if grown or one_at:
            added = _one_each(one_at, one_id, vocab)
            if grown:
                added = np.concatenate([added, flat_index(news, vocab, grown)])
            flat = to_device(torch.from_numpy(added), device)
            counts.view(-1).index_add_(0, flat, torch.ones_like(flat, dtype=torch.float32))
        return None if missing else Gathered(at, pend, commit, drafted)


class Gathered(NamedTuple):
    """PenaltyCounts.gather's answer for a step's penalized rows."""

    entries: list[int]  # each row's entry of counts and seen
    pending: list[int]  # each row's pending_row
    commit: bool  # the op is to add the tokens in flight to the counts (COMMIT)
    drafted: bool  # some row has drafts (the torch path: the one op takes none)


def _one_each(entries: list[int], ids: list[int], vocab: int) -> np.ndarray:
    """flat_index of one token an entry, where flat_index's general passes cost ~25 µs for
    32 rows (docs/benchmarks.md, "Penalties in one op")."""
    tokens = int64_array(ids)
    flat = int64_array(entries) * vocab + tokens
    return (
        flat
        if tokens.min(initial=0) >= 0 and tokens.max(initial=0) < vocab
        else flat[(tokens >= 0) & (tokens < vocab)]
    )
