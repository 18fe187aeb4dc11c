"""A step's outputs (RequestOutputs, or their fields as plain tuples: step_output.OutputRow)
-> the one StepOutputs message the detokenizer gets.

The columns are built straight from the outputs in one C-level pass (the tuples
transposed by zip), not a record per row: at 256 rows a step the row-by-row build was a
fifth of the host's step (docs/benchmarks.md, "Host step"; an attrgetter pass a column
cost more than the transpose: "Host step, eighth session"). The integer columns and a
decode step's logprobs go packed (common/messages/scheduler_detok.py), and finish_reasons
only when a row finished. Rows that finish, announce their request or carry logprobs
are looked at one by one; the common row is not.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Sequence
from itertools import chain
from operator import itemgetter
from typing import Any, Protocol

from common.messages import NewRequest, StepOutputs, pack_ids
from common.messages.scheduler_detok import pack_token_logprobs
from scheduler_worker.step_logprobs import RowLogprobs, token_logprobs
from scheduler_worker.step_output import OutputRow, RequestOutput, as_output

_FIRST = itemgetter(0)
_NO_COLUMNS: tuple[tuple, ...] = ((),) * len(RequestOutput._fields)


class Record(Protocol):
    """What the worker keeps of a request (worker.RequestRecord)."""

    tokenized_time: float
    detok_settings: NewRequest
    announced: bool


def step_message(
    step: int,
    outputs: Sequence[OutputRow],
    records: dict[str, Any],
    unannounced: set[str],
    **fields: Any,
) -> StepOutputs:
    """The StepOutputs of one step. `records`: the worker's records by request id, a
    finished request's popped; `unannounced`: ids whose detokenizer settings have not gone
    out yet (they go with the request's first output, in `new_requests`). `fields`: the
    message's replica, inbox and prefix_cache."""
    # RequestOutput's fields as columns (a step's outputs are tuples of them)
    rids, tokens, reasons, logprobs, num_prompt, num_output, *_, prompt_logprobs = (
        zip(*outputs) if outputs else _NO_COLUMNS
    )
    new_requests: list[NewRequest] = []
    if unannounced:
        for rid in rids:
            if rid in unannounced:
                unannounced.discard(rid)
                rec = records.get(rid)
                if rec is not None:
                    new_requests.append(rec.detok_settings)
                    rec.announced = True
    timings: list[dict | None] | None = None
    stop_ids: list[int | None] | None = None
    if reasons.count(None) != len(reasons):  # some request finished
        timings, stop_ids = [None] * len(outputs), [None] * len(outputs)
        to_wall = time.time() - time.monotonic()
        for i, row in enumerate(outputs):
            if row[2] is not None:  # finish_reason (a row may be a plain tuple)
                o = as_output(row)
                unannounced.discard(o.request_id)
                timings[i] = finished_timings(o, records.pop(o.request_id, None), to_wall)
                stop_ids[i] = o.stop_token_id
        if stop_ids.count(None) == len(stop_ids):
            stop_ids = None
    new_ids, num_new = _packed_ids(tokens)
    return StepOutputs(
        step=step,
        rids=list(rids),
        new_token_ids=new_ids,
        num_new_tokens=num_new,
        finish_reasons=None if timings is None else list(reasons),
        num_prompt_tokens=pack_ids(num_prompt),
        num_output_tokens=pack_ids(num_output),
        **_logprobs_columns(logprobs),
        new_requests=new_requests,
        timings=timings,
        sent_time=time.time(),
        stop_token_ids=stop_ids,
        prompt_logprobs=_optional(prompt_logprobs),
        **fields,
    )


def _packed_ids(tokens: Sequence[list[int]]) -> tuple[bytes, bytes | None]:
    """The new_token_ids and num_new_tokens columns: every row's tokens packed one row
    after another, and each row's count (None where every row has one: most steps)."""
    counts = list(map(len, tokens))
    if counts.count(1) == len(counts):
        return pack_ids(list(map(_FIRST, tokens))), None
    return pack_ids(list(chain.from_iterable(tokens))), pack_ids(counts)


def _optional(col: Sequence[Any]) -> list | None:
    """An optional column: None when no row has a value, else one entry a row."""
    return None if col.count(None) == len(col) else list(col)


def _logprobs_columns(col: Sequence[Any]) -> dict[str, Any]:
    """The message's logprobs fields: where each row with some has one token's (a decode
    step's), packed (token_logprobs: pack_token_logprobs), else the lists."""
    # comprehensions, whose loads are specialized, where C passes over the rows (map,
    # compress, attrgetter) ran the generic calls: 1,097 -> 959 instructions a row here
    # (docs/benchmarks.md, "Penalties in one op")
    at = [i for i, v in enumerate(col) if v is not None]
    if not at:
        return {"logprobs": None}
    rows = [col[i] for i in at]
    if all([len(v) == 1 for v in rows]):
        lps = [v[0] for v in rows]
        try:
            block = lps[0].block if type(lps[0]) is RowLogprobs else None
            if block is not None and all(
                [type(lp) is RowLogprobs and lp.block is block for lp in lps]
            ):
                # the usual step's: every row from one step's arrays, packed from them
                packed = block.pack(at, [lp.i for lp in lps])
            else:  # TokenLogprobs: (token_id, logprob, top_ids, top_logprobs)
                lps = list(map(token_logprobs, lps))
                args = [lp[1] for lp in lps], [lp[2] for lp in lps], [lp[3] for lp in lps]
                packed = pack_token_logprobs(at, *args)
            return {"logprobs": None, "token_logprobs": packed}
        except struct.error:  # a value past int32 or float: the lists
            pass
    return {"logprobs": _logprobs_column(col)}


def _logprobs_column(col: Sequence[Any]) -> list | None:
    """The logprobs column as lists, _wire_logprobs a row (None: no row has some): rows of
    several tokens (accepted drafts), or values the packed form cannot hold."""
    if col.count(None) == len(col):
        return None
    return [None if v is None else _wire_logprobs(v) for v in col]


def _wire_logprobs(lps: list) -> list | None:
    """A row's TokenLogprobs as the wire has them: [logprob, [[id, logprob], ...]] a token."""
    if not lps:
        return None
    return [
        [lp.logprob, list(map(list, zip(lp.top_ids, lp.top_logprobs)))]
        for lp in map(token_logprobs, lps)
    ]


def finished_timings(o: RequestOutput, rec: Record | None, to_wall: float) -> dict:
    """Wall-clock stage stamps of a finished request (seconds since the epoch; every
    process on one host reads the same clock — across hosts, keep clocks in sync). The
    arrival time is the frontend's own: it never left it."""
    st = o.stage_times or {}
    out: dict = {"tokenized_time": None if rec is None else rec.tokenized_time}
    for key in ("received", "first_scheduled", "first_token", "finished"):
        v = st.get(key)
        out[f"{key}_time" if key != "received" else "scheduler_received_time"] = (
            None if v is None else v + to_wall
        )
    out["num_cached_tokens"] = st.get("num_cached_tokens", 0)
    out["num_preemptions"] = st.get("num_preemptions", 0)
    if "num_draft_tokens" in st:  # speculative decoding drafted for it
        out["num_draft_tokens"] = st["num_draft_tokens"]
        out["num_accepted_tokens"] = st["num_accepted_tokens"]
    if "accepted_prediction_tokens" in st:  # it had a prediction
        out["accepted_prediction_tokens"] = st["accepted_prediction_tokens"]
        out["rejected_prediction_tokens"] = st["rejected_prediction_tokens"]
    return out
