"""scheduler_worker → detok_worker: ONE message per engine step covering every request.

The per-request fields are parallel columns indexed like `rids`: build the message with
`pack_step_outputs` from one StepOutput per request, read it with `unpack_step_outputs`
(which refuses columns of unequal lengths); both are `STEP_COLUMNS` (messages.columnar),
with the integer columns packed (`pack_ids`: int32 each): every row's new tokens one after
the other, with each row's count only where some row has other than one (a decode step's
rows have one each), and the prompt and output lengths. A list column cost the scheduler
a msgpack item and a type check a row each step (docs/benchmarks.md, "The host step in
instructions"); a packed one costs one of each.
A request's detokenizer settings travel once, in `new_requests`, in the first StepOutputs
that mentions it.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate, chain
from types import SimpleNamespace
from typing import Any, ClassVar

from common.messages.base import Message, WireError, pack_ids, unpack_ids
from common.messages.columnar import Columnar

# (rid, stop strings, skip_special_tokens, include_stop_str_in_output, the frontend that
# accepted it: its outputs go to that one's inbox, GenerateRequest.frontend; min_tokens:
# no stop string ends it before that many tokens, as vLLM)
NewRequest = tuple[str, list[str], bool, bool, int, int]


@dataclass(frozen=True, slots=True)
class StepOutputs(Message):
    TAG: ClassVar[int] = 4
    step: int
    rids: list[str]
    # pack_ids of every request's new tokens, one request's after another's
    new_token_ids: bytes
    # pack_ids of each request's count of them (0: e.g. an abort); None: one each
    num_new_tokens: bytes | None
    # "stop" | "length" | "abort" | None (still running); None: none finished
    finish_reasons: list[str | None] | None
    num_prompt_tokens: bytes  # pack_ids, one a request
    num_output_tokens: bytes  # pack_ids: total so far, including this step's
    # None when no request in the step asked; else one entry per request: None, or one
    # entry per new token, e.g. [logprob, [[token_id, logprob], ...top-N]]
    logprobs: list[list | None] | None
    new_requests: list[NewRequest]
    # None when no request asked; else per request None or a dict of timestamps
    timings: list[dict[str, Any] | None] | None
    sent_time: float
    # None when no request finished on one of its stop_token_ids in this step; else per
    # request that token (the last of its new_token_ids) or None
    stop_token_ids: list[int | None] | None = None
    # None when no request in the step sends prompt logprobs (SamplingParams.prompt_logprobs,
    # with a request's first token); else per request None or one entry per prompt token:
    # [token_id, logprob (None for the first), [[token_id, logprob], ...top-N]]
    prompt_logprobs: list[list | None] | None = None
    # which replica stepped, and its inbox: a stop-string abort goes back there
    replica: int = 0
    inbox: str | None = None
    # the replica's cumulative prefix-cache [queries, hits] in tokens, as of this step
    prefix_cache: list[int] | None = None
    # the logprobs column packed (pack_token_logprobs), where each row that has logprobs
    # has one token's (a decode step's); `logprobs` is then None. unpack_step_outputs
    # gives the column as lists either way
    token_logprobs: bytes | None = None


@dataclass(slots=True)
class StepOutput:
    """One request's part of a StepOutputs (not a message itself)."""

    rid: str
    new_token_ids: bytes  # pack_ids
    finish_reason: str | None
    num_prompt_tokens: int
    num_output_tokens: int
    logprobs: list | None = None
    timings: dict[str, Any] | None = None
    stop_token_id: int | None = None
    prompt_logprobs: list | None = None


STEP_COLUMNS: Columnar[StepOutput] = Columnar(
    StepOutput,
    StepOutputs,
    rename={"rid": "rids", "finish_reason": "finish_reasons", "stop_token_id": "stop_token_ids"},
    optional=("finish_reason", "logprobs", "timings", "stop_token_id", "prompt_logprobs"),
)


def pack_step_outputs(
    step: int,
    outputs: Sequence[StepOutput],
    new_requests: list[NewRequest],
    replica: int = 0,
    inbox: str | None = None,
    prefix_cache: list[int] | None = None,
) -> StepOutputs:
    return StepOutputs(
        step=step,
        new_requests=new_requests,
        sent_time=time.time(),
        replica=replica,
        inbox=inbox,
        prefix_cache=prefix_cache,
        **packed_columns(STEP_COLUMNS.pack(outputs)),
    )


def packed_columns(cols: dict[str, Any]) -> dict[str, Any]:
    """STEP_COLUMNS.pack's lists with the integer columns packed (as on the wire)."""
    ids: list[bytes] = cols["new_token_ids"]
    counts = [len(b) // 4 for b in ids]
    return {
        **cols,
        "new_token_ids": b"".join(ids),
        "num_new_tokens": None if counts.count(1) == len(counts) else pack_ids(counts),
        "num_prompt_tokens": pack_ids(cols["num_prompt_tokens"]),
        "num_output_tokens": pack_ids(cols["num_output_tokens"]),
    }


def unpack_step_outputs(msg: StepOutputs) -> list[StepOutput]:
    """One StepOutput per rid; WireError if the per-request columns do not line up."""
    n = len(msg.rids)
    data = msg.new_token_ids
    ends: Sequence[int]
    if msg.num_new_tokens is None:
        ends = range(4, 4 * n + 1, 4)
        total = n
    else:
        ends = [4 * e for e in accumulate(unpack_ids(msg.num_new_tokens))]
        total = len(ends) and ends[-1] // 4
        if len(ends) != n:
            raise WireError(f"StepOutputs: num_new_tokens not as long as rids ({n})")
    if len(data) != 4 * total:
        raise WireError(f"StepOutputs: {len(data)} bytes of new tokens for {total} tokens")
    starts = [0, *ends[:-1]] if n else []
    cols = {c.column: getattr(msg, c.column) for c in STEP_COLUMNS.columns}
    cols["new_token_ids"] = [data[a:b] for a, b in zip(starts, ends)]
    cols["num_prompt_tokens"] = unpack_ids(msg.num_prompt_tokens)
    cols["num_output_tokens"] = unpack_ids(msg.num_output_tokens)
    if msg.token_logprobs is not None:
        if msg.logprobs is not None:
            raise WireError("StepOutputs: logprobs both packed and as lists")
        cols["logprobs"] = unpack_token_logprobs(msg.token_logprobs, n)
    return STEP_COLUMNS.unpack(SimpleNamespace(**cols), "StepOutputs")


def pack_token_logprobs(
    rows: Sequence[int],
    logprobs: Sequence[float],
    top_ids: Sequence[Sequence[int]],
    top_logprobs: Sequence[Sequence[float]],
) -> bytes:
    """StepOutputs.token_logprobs: for rows `rows` (increasing), each one token's logprob
    and its top-N (ids, logprobs), as k, then rows and N (int32 each), the logprobs
    (float64: the values as they were), then every row's top ids (int32) and their
    logprobs (float64). struct.error where a value does not fit (the caller sends lists).
    The logprobs column's lists cost the scheduler a build, a check and a msgpack item
    for each number of each row (docs/benchmarks.md, "The chat mix's sampler")."""
    counts = list(map(len, top_ids))
    k, t = len(rows), sum(counts)
    if list(map(len, top_logprobs)) != counts:
        raise struct.error("top ids and top logprobs of unequal lengths")
    return struct.pack(
        f"<I{k}i{k}i{k}d{t}i{t}d",
        k,
        *rows,
        *counts,
        *logprobs,
        *chain.from_iterable(top_ids),
        *chain.from_iterable(top_logprobs),
    )


def unpack_token_logprobs(data: bytes, n: int) -> list[list | None]:
    """The logprobs column of a step of n rows from pack_token_logprobs' bytes: None, or
    [[logprob, [[id, logprob], ...]]] a row; WireError if they do not make one."""
    if len(data) < 4:
        raise WireError("StepOutputs: token_logprobs shorter than its count")
    (k,) = struct.unpack_from("<I", data)
    head = 4 + 16 * k
    if k > n or len(data) < head:
        raise WireError(f"StepOutputs: token_logprobs of {k} rows for {n}")
    rows = struct.unpack_from(f"<{k}i", data, 4)
    counts = struct.unpack_from(f"<{k}i", data, 4 + 4 * k)
    lps = struct.unpack_from(f"<{k}d", data, 4 + 8 * k)
    if min(counts, default=0) < 0 or len(data) != head + 12 * sum(counts):
        raise WireError("StepOutputs: token_logprobs' top-N counts do not match its bytes")
    if list(rows) != sorted(set(rows)) or (k and not 0 <= rows[0] <= rows[-1] < n):
        raise WireError("StepOutputs: token_logprobs' rows not increasing within the step")
    t = sum(counts)
    ids = struct.unpack_from(f"<{t}i", data, head)
    top_lps = struct.unpack_from(f"<{t}d", data, head + 4 * t)
    out: list[list | None] = [None] * n
    ends = list(accumulate(counts))
    for row, lp, start, end in zip(rows, lps, [0, *ends], ends):
        out[row] = [[lp, [[i, v] for i, v in zip(ids[start:end], top_lps[start:end])]]]
    return out
