"""A step's sampling parameters as the sampler reads them: which rows draw, carry a
penalty, a logit_bias, min_tokens, logprobs or a seed, and their numbers (temperature,
top_p, min_p, top_k, logprobs, seed) as one array [rows, NUM_VALUES]. Kept while the
next step's rows hold the same parameters in the same order (an overlapped decode batch,
most steps); where the rows carry their slot (Request.slot), each slot's kinds are kept as
bits of a per-slot array, written when a slot's parameters change, so a batch whose rows
come and go (rows that join, finish or are preempted) reads its kinds by one numpy index, as vLLM
v1's InputBatch keeps its rows' parameters: the host's work follows what changed, not the
rows (docs/benchmarks.md, "Host step, persistent rows", "Persistent decode batch" and
"Host step, seventh session").
The numbers are kept per slot the same way and gathered by one index a step, so the
sampler builds its parameter tensors from columns, not from a Python list a row.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from common.sampling_params import SamplingParams
from scheduler_worker.penalty_counts import PenaltyCounts

GREEDY_EPS = 1e-5  # temperatures below this are greedy: logits / T would overflow


def is_greedy(p: SamplingParams) -> bool:
    return p.top_k == 1 or p.temperature < GREEDY_EPS


def has_penalty(p: SamplingParams) -> bool:
    return p.repetition_penalty != 1.0 or p.presence_penalty != 0.0 or p.frequency_penalty != 0.0


def plain_greedy_params(p: SamplingParams) -> bool:
    """A row of these params takes the argmax of its raw logits (after any grammar mask)
    once min_tokens are out: greedy, with no penalty, no logit_bias and no logprobs."""
    return is_greedy(p) and not has_penalty(p) and not p.logit_bias and p.logprobs is None


# the columns of a row's numbers (param_values): floats, and ints below 2**53 (a seed as its
# two 32-bit halves); HAS_SEED 1.0 where the row has a seed; then its penalties
TEMPERATURE, TOP_P, MIN_P, TOP_K, NUM_TOP, HAS_SEED, SEED_LO, SEED_HI = range(8)
REPETITION, PRESENCE, FREQUENCY = range(8, 11)
NUM_VALUES = 11
_M32 = 0xFFFFFFFF


def param_values(p: SamplingParams) -> tuple[float, ...]:
    """A row's numbers, in the columns above (the seed's halves as seeded_uniforms takes
    them: a negative seed by its two's complement)."""
    seed = p.seed or 0
    return (
        p.temperature,
        p.top_p,
        p.min_p,
        p.top_k,
        p.logprobs or 0,
        p.seed is not None,
        seed & _M32,
        (seed >> 32) & _M32,
        p.repetition_penalty,
        p.presence_penalty,
        p.frequency_penalty,
    )


def values_of(params: list[SamplingParams]) -> np.ndarray:
    """[rows, NUM_VALUES] float64: each row's param_values."""
    return np.array(list(map(param_values, params)), dtype=np.float64).reshape(-1, NUM_VALUES)


@dataclass(eq=False)
class BatchParams:
    params: list[SamplingParams]
    plain: bool  # every row plain greedy (plain_greedy_params) once its min_tokens are out
    min_tokens: list[int]  # the rows with min_tokens (their stop tokens may be masked)
    draws: list[int]  # the rows that sample (not greedy)
    penalized: list[int]
    biased: list[int]
    logprobs: list[int]  # the rows that ask for logprobs
    values: np.ndarray  # [rows, NUM_VALUES] float64: each row's param_values
    rows: list[Any] | None = None  # the sampler's rows it is of (BatchParamsCache.of_rows)
    # what the sampler derives from these parameters alone (never from the rows' tokens),
    # kept with them: a step of the same rows sends its keys and counts, not its columns
    memo: dict[str, Any] = field(default_factory=dict)

    @property
    def num_top(self) -> list[int]:
        """The logprobs rows' N (top logprobs), kept with the rows' parameters."""
        got = self.memo.get("num_top")
        if got is None:
            got = self.memo["num_top"] = self.values[self.logprobs, NUM_TOP].astype(int).tolist()
        return got

    @classmethod
    def of(cls, params: list[SamplingParams]) -> BatchParams:
        rows = list(enumerate(params))
        return cls(
            params,
            all(map(plain_greedy_params, params)),
            [i for i, p in rows if p.min_tokens],
            [i for i, p in rows if not is_greedy(p)],
            [i for i, p in rows if has_penalty(p)],
            [i for i, p in rows if p.logit_bias],
            [i for i, p in rows if p.logprobs is not None],
            values_of(params),
        )


# a slot's kinds, as bits (BatchParamsCache.kinds)
_DRAW, _PENALTY, _BIAS, _MIN_TOKENS, _LOGPROBS, _NOT_PLAIN = 1, 2, 4, 8, 16, 32


def kind_bits(p: SamplingParams) -> int:
    return (
        (0 if is_greedy(p) else _DRAW)
        | (_PENALTY if has_penalty(p) else 0)
        | (_BIAS if p.logit_bias else 0)
        | (_MIN_TOKENS if p.min_tokens else 0)
        | (_LOGPROBS if p.logprobs is not None else 0)
        | (0 if plain_greedy_params(p) else _NOT_PLAIN)
    )


class BatchParamsCache:
    """The last step's BatchParams, reused while the rows' parameters are the same (a
    list comparison: the same objects compare by identity, in C); else, given the rows'
    slots, built from the per-slot kinds and numbers.

    Invariant: kinds[s] == kind_bits(at[s]) and values[s] == param_values(at[s]) for every
    slot s; a slot whose row now holds other parameters (a new request in it) is rewritten
    before it is read, so no request reads its slot's last holder's."""

    def __init__(self) -> None:
        self.last: BatchParams | None = None
        self.at: list[SamplingParams | None] = []  # the parameters each slot's kinds are of
        self.kinds = np.zeros(0, dtype=np.uint8)
        self.values = np.zeros((0, NUM_VALUES), dtype=np.float64)
        self.counts = PenaltyCounts()  # penalized slots' token counts, on the device

    def get(self, params: list[SamplingParams], slots: list[int] | None = None) -> BatchParams:
        """slots: the rows' slots (each >= 0, a slot's rows with one request's parameters),
        or None (rows without slots: built from the parameters)."""
        if self.last is not None and self.last.params == params:
            return self.last
        self.last = BatchParams.of(params) if slots is None else self._of_slots(params, slots)
        return self.last

    def of_rows(self, rows: Sequence[Any]) -> BatchParams:
        """The BatchParams of the sampler's rows (logits_processors.SampledRow): the last
        step's for the same rows (a list compare, by identity: a row's parameters never
        change), else get()'s from their parameters and slots."""
        last = self.last
        if last is not None and last.rows == rows:
            return last
        params, slots = [row.params for row in rows], [row.slot for row in rows]
        batch = self.get(params, None if -1 in slots else slots)
        batch.rows = list(rows)
        return batch

    def _of_slots(self, params: list[SamplingParams], slots: list[int]) -> BatchParams:
        at = self.at
        if slots and max(slots) >= len(at):
            grow = max(slots) + 1 - len(at)
            at += [None] * grow
            self.kinds = np.concatenate([self.kinds, np.zeros(grow, dtype=np.uint8)])
            self.values = np.concatenate([self.values, np.zeros((grow, NUM_VALUES))])
        if list(map(at.__getitem__, slots)) != params:  # joined rows: their slots rewritten
            for s, p in zip(slots, params):
                if at[s] is not p:
                    at[s], self.kinds[s], self.values[s] = p, kind_bits(p), param_values(p)
        idx = np.array(slots, dtype=np.intp)  # once: numpy converts a list index at each use
        k = self.kinds[idx]
        min_tokens, draws, penalized, biased, logprobs = (
            (k & bit).nonzero()[0].tolist()  # 1-D: flatnonzero without its wrappers
            for bit in (_MIN_TOKENS, _DRAW, _PENALTY, _BIAS, _LOGPROBS)
        )
        plain = not (k & _NOT_PLAIN).any()
        return BatchParams(
            params, plain, min_tokens, draws, penalized, biased, logprobs, self.values[idx]
        )
