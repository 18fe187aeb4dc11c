"""A step's tokens into its requests, the common row in one loop.

Most rows of a decode step are alike: running, past their first token, without a grammar
or prompt logprobs (Request.resolves_inline) or drafts, their token neither a stop nor
their last (a penalty or a token's logprobs change nothing here: the logprobs go in the
output as the engine's).
For those, `resolve_rows` does Scheduler.resolve's work and appends the row's output
fields to the step's columns inline (step_output.OutputColumns): a call a row and the
checks such a row cannot need were a tenth of the host's step at 256 rows
(docs/benchmarks.md, "Host step, persistent rows"). Any other row goes to `other` (the
engine: resolve, grammar, verify, last output) in its place, so the outputs keep the
step's row order.

Overlapped, the usual step launches the very rows whose tokens it then reads, in the same
order (`fusable`): their advance (Scheduler.advance, a placeholder each) then waits for the
resolve and runs in its loop (`resolve_and_advance`), a row's record read once, its
placeholder count unchanged (docs/benchmarks.md, "Host step per row, per-slot arrays"):

    launch N (no advance) ──▶ read N-1's tokens ──▶ each row: advance for N, resolve N-1

Where the launched step's rows are rows with no token in flight (advanced first), then rows
of the step in flight in its order less those finished meanwhile, the same loop runs each
row at its new row of step N (`Fused`; docs/benchmarks.md, "Host step, eighth session").
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from itertools import repeat
from operator import attrgetter, itemgetter
from typing import NamedTuple

from scheduler_worker.decode_batch import advance_decodes
from scheduler_worker.request import PLACEHOLDER, Request
from scheduler_worker.scheduled_batch import ScheduledBatch
from scheduler_worker.scheduler import Scheduler
from scheduler_worker.step_logprobs import RowLogprobs, TokenLogprobs
from scheduler_worker.step_output import OutputColumns, RequestOutput

_REQ = itemgetter(0)
_FLIGHT_ROW = attrgetter("flight_row")
Logprobs = TokenLogprobs | RowLogprobs | None  # a row's (DeviceSample.result)
OtherRow = Callable[[Request, int, int, Logprobs], "RequestOutput | None"]


def resolve_rows(
    scheduler: Scheduler,
    sampled: Sequence[tuple[Request, int]],
    token_ids: Sequence[int],
    logprobs: Sequence[Logprobs],
    drafts: dict,
    other: OtherRow,
    outputs: OutputColumns,
) -> None:
    """Each sampled (request, placeholder index) takes its token; the outputs of the rows
    that have one (a row that finished before its token has none) go into `outputs`, in
    row order."""
    add, lps, rids, (rid_at, token_at, prompt_at, output_at, cached_at) = _appends(outputs)
    bs, hash_blocks = scheduler.block_size, scheduler._hash_blocks
    for (req, index), token, lp in zip(sampled, token_ids, logprobs):
        n_out = index + 1 - req.num_prompt_tokens
        if (
            not req.resolves_inline
            or token in req.stop_tokens
            or n_out >= req.max_tokens
            or drafts
            and req.request_id in drafts
        ):
            out = other(req, index, token, lp)
            if out is not None:
                add(out)
            continue
        # Scheduler.resolve's common case: the placeholder becomes the token, the blocks
        # it fills are hashed (the request neither stops nor ends here). Its tokens are
        # known up to index (placeholders resolve in order: the later ones are pending)
        req.num_pending -= 1
        tokens = req.token_ids
        tokens[index] = token
        req.output_token_ids[n_out - 1] = token
        computed = req.num_computed_tokens
        if computed // bs > req.num_hashed_blocks and min(computed, index + 1) // bs > (
            req.num_hashed_blocks
        ):
            hash_blocks(req)
        num_prompt = req.num_prompt_tokens
        # the row's output fields into the step's columns (step_output.OutputColumns)
        if lp is not None:  # the few rows asking for logprobs, by their row
            lps[len(rids)] = [lp]
        rid_at(req.request_id)
        token_at(token)
        prompt_at(num_prompt)
        output_at(n_out)  # its tokens out so far (not the step in flight's placeholder)
        cached_at(req.num_cached_tokens)


class Fused(NamedTuple):
    """A launched batch whose advance runs in the resolve loop: `joins`, its leading rows
    with no token in flight, advance first; `rows`, the others, are rows of the step in
    flight in its order (those it lacks only resolve)."""

    joins: list[tuple[Request, int]]
    rows: list[Request]


def fusable(
    sched: Scheduler, batch: ScheduledBatch, sampled: list[tuple[Request, int]]
) -> Fused | None:
    """The launched batch's advance may wait for the resolve of the step in flight
    (`sampled`) and run in its loop (resolve_and_advance): a decode-only batch kept in
    place, of the same rows in the same order (the usual overlapped step), or of rows
    without a token in flight then rows in flight in the same order (less those ended)."""
    if not batch.decodes_kept or batch.drafts or sched.sliding_window is not None:
        return None
    entries = batch.entries
    if batch.num_decode != len(entries):
        return None
    reqs, flying = list(map(_REQ, entries.values())), list(map(_REQ, sampled))
    if reqs == flying:
        return Fused([], reqs)
    # plain loops: C passes over the rows took ~3x (docs/benchmarks.md, "Host step, tenth
    # session")
    k = 0  # the rows with no token in flight, all first
    for req in reqs:
        if req.num_pending:
            break
        k += 1
    last, num_flying = 0, len(flying)
    for req in reqs[k:]:  # each one's row in the step in flight, in order
        row = req.flight_row
        if not req.num_pending or not last <= row < num_flying or flying[row] is not req:
            return None
        last = row
    return Fused(list(entries.values())[:k], reqs[k:])


def resolve_and_advance(
    scheduler: Scheduler,
    sampled: Sequence[tuple[Request, int]],
    token_ids: Sequence[int],
    logprobs: Sequence[Logprobs],
    other: OtherRow,
    outputs: OutputColumns,
    advanced: list[tuple[Request, int]],
    fused: Fused | None = None,
) -> None:
    """resolve_rows for the step in flight whose rows the launched step decodes again, in
    the same order (fusable): each row first advances for the launched step (a placeholder,
    as Scheduler.advance: appended to `advanced`), then takes its token. Its record is
    read once, and its count of placeholders stays as it was. `fused`: fusable's answer
    (None: the same rows)."""
    if fused is not None and (fused.joins or len(fused.rows) != len(sampled)):
        _resolve_and_advance_some(
            scheduler, sampled, token_ids, logprobs, other, outputs, advanced, fused
        )
        return
    add, lps, rids, (rid_at, token_at, prompt_at, output_at, cached_at) = _appends(outputs)
    place, placeholder = advanced.append, PLACEHOLDER
    bs, hash_blocks = scheduler.block_size, scheduler._hash_blocks
    active = scheduler.active
    # each row's flight_row is its row in `sampled` (Scheduler.advance): the same row now
    for (req, index), token, lp in zip(sampled, token_ids, logprobs):
        tokens = req.token_ids
        new = len(tokens)  # the launched step's placeholder goes there
        num_prompt = req.num_prompt_tokens
        n_new = new + 1 - num_prompt  # outputs with the launched step's (this one's: fewer)
        ends = False  # this token is its last (only if the next one is)
        if n_new >= req.max_tokens:
            active.pop(req.request_id, None)  # its last token: done when resolved
            ends = index + 1 - num_prompt >= req.max_tokens
        if not req.resolves_inline or token in req.stop_tokens or ends:
            _advance_row(scheduler, req, new)
            place((req, new))
            out = other(req, index, token, lp)
            if out is not None:
                add(out)
            continue
        place((req, new))
        computed = req.num_computed_tokens = req.num_computed_tokens + 1
        tokens[index] = token
        tokens.append(placeholder)
        outs = req.output_token_ids
        outs[index - num_prompt] = token
        outs.append(placeholder)
        # min(...) <= computed: the cheap test first (a block fills one step in bs)
        if computed // bs > req.num_hashed_blocks and min(computed, index + 1) // bs > (
            req.num_hashed_blocks
        ):
            hash_blocks(req)
        if lp is not None:  # the few rows asking for logprobs, by their row
            lps[len(rids)] = [lp]
        rid_at(req.request_id)
        token_at(token)
        prompt_at(num_prompt)
        output_at(n_new - 1)  # its tokens so far (index + 1 - num_prompt): not the launched
        cached_at(req.num_cached_tokens)


def _advance_row(scheduler: Scheduler, req: Request, new: int) -> None:
    """Scheduler.advance of one decode row (advance_decodes' body): its token computed,
    a placeholder at `new`."""
    computed = req.num_computed_tokens = req.num_computed_tokens + 1
    if not req.num_pending and computed // scheduler.block_size > req.num_hashed_blocks:
        scheduler._hash_blocks(req)
    req.token_ids.append(PLACEHOLDER)
    req.output_token_ids.append(PLACEHOLDER)
    req.num_pending += 1


def _resolve_and_advance_some(
    scheduler: Scheduler,
    sampled: Sequence[tuple[Request, int]],
    token_ids: Sequence[int],
    logprobs: Sequence[Logprobs],
    other: OtherRow,
    outputs: OutputColumns,
    advanced: list[tuple[Request, int]],
    fused: Fused,
) -> None:
    """resolve_and_advance where the launched rows are `fused.joins` (advanced first, as
    Scheduler.advance would) then `fused.rows`, a subsequence of the step in flight's:
    each of those advances, at its new row, then takes its token in the loop; a row the
    launched step lacks only takes its token (resolve_rows)."""
    advance_decodes(scheduler, fused.joins, advanced, True)
    # in C: which rows of `sampled` the launched step keeps (their flight_row, fusable),
    # then their rows in it (nothing reads a flight_row while its step resolves)
    at, start = list(map(_FLIGHT_ROW, fused.rows)), len(advanced)
    launched = [False] * len(sampled)
    deque(map(launched.__setitem__, at, repeat(True)), 0)
    deque(map(setattr, fused.rows, repeat("flight_row"), range(start, start + len(at))), 0)
    add, lps, rids, (rid_at, token_at, prompt_at, output_at, cached_at) = _appends(outputs)
    place, placeholder = advanced.append, PLACEHOLDER
    bs, hash_blocks = scheduler.block_size, scheduler._hash_blocks
    active = scheduler.active
    for (req, index), token, lp, kept in zip(sampled, token_ids, logprobs, launched):
        if not kept:  # sits the launched step out: its token only
            resolve_rows(scheduler, [(req, index)], [token], [lp], {}, other, outputs)
            continue
        tokens = req.token_ids
        new = len(tokens)  # the launched step's placeholder goes there
        num_prompt = req.num_prompt_tokens
        n_new = new + 1 - num_prompt  # outputs with the launched step's (this one's: fewer)
        ends = False  # this token is its last (only if the next one is)
        if n_new >= req.max_tokens:
            active.pop(req.request_id, None)  # its last token: done when resolved
            ends = index + 1 - num_prompt >= req.max_tokens
        place((req, new))
        if not req.resolves_inline or token in req.stop_tokens or ends:
            _advance_row(scheduler, req, new)
            out = other(req, index, token, lp)
            if out is not None:
                add(out)
            continue
        computed = req.num_computed_tokens = req.num_computed_tokens + 1
        tokens[index] = token
        tokens.append(placeholder)
        outs = req.output_token_ids
        outs[index - num_prompt] = token
        outs.append(placeholder)
        if computed // bs > req.num_hashed_blocks and min(computed, index + 1) // bs > (
            req.num_hashed_blocks
        ):
            hash_blocks(req)
        if lp is not None:  # the few rows asking for logprobs, by their row
            lps[len(rids)] = [lp]
        rid_at(req.request_id)
        token_at(token)
        prompt_at(num_prompt)
        output_at(n_new - 1)
        cached_at(req.num_cached_tokens)


def _appends(
    outputs: OutputColumns,
) -> tuple[Callable, dict[int, list], list[str], tuple[Callable, ...]]:
    """outputs.add, its logprobs by row and its request ids (a row's index: their length
    before its own), and the append of each column a common row fills, in its order: a
    row's request id, token, prompt, output and cached token counts."""
    o = outputs
    columns = (o.request_ids, o.token_ids, o.num_prompt, o.num_output, o.num_cached)
    return o.add, o.logprobs, o.request_ids, tuple(col.append for col in columns)
