"""A step's outputs (step_output.OutputColumns) -> the one StepOutputs message the
detokenizer gets.

The outputs are columns already (the resolve loop appends a common row's fields to them:
no record a row, no transpose; docs/benchmarks.md, "A step's outputs as columns"). The
integer columns and a decode step's logprobs go packed
(common/messages/scheduler_detok.py), and finish_reasons only when a row finished. Rows
that finish, announce their request or carry logprobs are looked at one by one; the
common row is not.
"""

from __future__ import annotations

import struct
import time
from typing import Any, Protocol

from common.messages import NewRequest, StepOutputs, pack_ids
from common.messages.scheduler_detok import pack_token_logprobs
from scheduler_worker.step_logprobs import RowLogprobs, token_logprobs
from scheduler_worker.step_output import OutputColumns, RequestOutput


class Record(Protocol):
    """What the worker keeps of a request (worker.RequestRecord)."""

    tokenized_time: float
    detok_settings: NewRequest
    announced: bool


def step_message(
    step: int,
    outputs: OutputColumns,
    records: dict[str, Any],
    unannounced: set[str],
    **fields: Any,
) -> StepOutputs:
    """The StepOutputs of one step. `records`: the worker's records by request id, a
    finished request's popped; `unannounced`: ids whose detokenizer settings have not gone
    out yet (they go with the request's first output, in `new_requests`). `fields`: the
    message's replica, inbox and prefix_cache."""
    rids, n = outputs.request_ids, len(outputs)
    new_requests: list[NewRequest] = []
    if unannounced:
        for rid in rids:
            if rid in unannounced:
                unannounced.discard(rid)
                rec = records.get(rid)
                if rec is not None:
                    new_requests.append(rec.detok_settings)
                    rec.announced = True
    reasons: list[str | None] | None = None
    timings: list[dict | None] | None = None
    stop_ids: list[int | None] | None = None
    prompt_logprobs: list | None = None
    apart = outputs.apart  # the rows with a field past the columns: few, most steps none
    if apart:
        finished = {i: o for i, o in apart.items() if o.finish_reason is not None}
        if finished:  # some request finished
            reasons, timings, stop_ids = [None] * n, [None] * n, [None] * n
            to_wall = time.time() - time.monotonic()
            for i, o in finished.items():
                reasons[i] = o.finish_reason
                unannounced.discard(o.request_id)
                timings[i] = finished_timings(o, records.pop(o.request_id, None), to_wall)
                stop_ids[i] = o.stop_token_id
            if stop_ids.count(None) == n:
                stop_ids = None
        if any(o.prompt_logprobs is not None for o in apart.values()):
            prompt_logprobs = [None] * n
            for i, o in apart.items():
                prompt_logprobs[i] = o.prompt_logprobs
    return StepOutputs(
        step=step,
        rids=list(rids),
        new_token_ids=pack_ids(outputs.token_ids),
        num_new_tokens=_num_new(outputs.counts, n),
        finish_reasons=reasons,
        num_prompt_tokens=pack_ids(outputs.num_prompt),
        num_output_tokens=pack_ids(outputs.num_output),
        **_logprobs_columns(outputs.logprobs, n),
        new_requests=new_requests,
        timings=timings,
        sent_time=time.time(),
        stop_token_ids=stop_ids,
        prompt_logprobs=prompt_logprobs,
        **fields,
    )


def _num_new(counts: dict[int, int], n: int) -> bytes | None:
    """The num_new_tokens column: each row's count of new tokens, packed (None where every
    row has one: most steps)."""
    if not counts:
        return None
    col = [1] * n
    for i, c in counts.items():
        col[i] = c
    return pack_ids(col)


def _logprobs_columns(col: dict[int, list], n: int) -> dict[str, Any]:
    """The message's logprobs fields for n rows, `col` the logprobs of those that have
    some, by row (OutputColumns.logprobs): where each has one token's (a decode step's),
    packed (token_logprobs: pack_token_logprobs), else the lists."""
    if not col:
        return {"logprobs": None}
    at = sorted(col)  # in row order already (rows are added in order): a C pass
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
    return {"logprobs": _logprobs_column(col, n)}


def _logprobs_column(col: dict[int, list], n: int) -> list | None:
    """The logprobs column of n rows as lists, _wire_logprobs a row (None: no row has
    some): rows of several tokens (accepted drafts), or values the packed form cannot
    hold."""
    if not col:
        return None
    column: list = [None] * n
    for i, v in col.items():
        column[i] = _wire_logprobs(v)
    return column


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
