"""A step's sampling parameters as the sampler reads them: which rows draw, carry a
penalty, a logit_bias, min_tokens or logprobs. Worked out in one pass and kept while the
next step's rows hold the same parameters in the same order (an overlapped decode batch,
most steps), as vLLM v1's InputBatch keeps its rows' parameters between steps: the host's
work then follows what changed, not the rows (docs/benchmarks.md, "Host step, persistent
rows").
"""

from __future__ import annotations

from dataclasses import dataclass

from common.sampling_params import SamplingParams

GREEDY_EPS = 1e-5  # temperatures below this are greedy: logits / T would overflow


def is_greedy(p: SamplingParams) -> bool:
    return p.top_k == 1 or p.temperature < GREEDY_EPS


def has_penalty(p: SamplingParams) -> bool:
    return p.repetition_penalty != 1.0 or p.presence_penalty != 0.0 or p.frequency_penalty != 0.0


def plain_greedy_params(p: SamplingParams) -> bool:
    """A row of these params takes the argmax of its raw logits (after any grammar mask)
    once min_tokens are out: greedy, with no penalty, no logit_bias and no logprobs."""
    return is_greedy(p) and not has_penalty(p) and not p.logit_bias and p.logprobs is None


@dataclass(eq=False)
class BatchParams:
    params: list[SamplingParams]
    plain: bool  # every row plain greedy (plain_greedy_params) once its min_tokens are out
    min_tokens: list[int]  # the rows with min_tokens (their stop tokens may be masked)
    draws: list[int]  # the rows that sample (not greedy)
    penalized: list[int]
    biased: list[int]
    logprobs: list[int]  # the rows that ask for logprobs

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
        )


class BatchParamsCache:
    """The last step's BatchParams, reused while the rows' parameters are the same (a
    list comparison: the same objects compare by identity, in C)."""

    def __init__(self) -> None:
        self.last: BatchParams | None = None

    def get(self, params: list[SamplingParams]) -> BatchParams:
        if self.last is None or self.last.params != params:
            self.last = BatchParams.of(params)
        return self.last
