"""The decode batch kept between steps: Scheduler.active holds the decode rows in
round-robin order as a dict of the entries a batch takes (rid -> (request, 1)), written
only where a row changes, so a step's host work for a running row is its own record's
update (docs/benchmarks.md, "Persistent decode batch"):

    joins        a request that samples its first token (advance): appended
    leaves       finish, abort, preemption (Scheduler._release), max_tokens reached
                 (advance): deleted
    new block    a row whose token starts one: Scheduler._reserve (which may preempt)

Where every row fits the decode batch and none may draft (the usual step), the batch's
decode entries are a copy of the dict (take_decodes) and the rows stay in place; else
Scheduler.schedule takes them row by row from the front, and advance puts them back at
the end (round-robin). Both give the same batches in the same order
(tests/scheduler_worker/test_decode_batch.py).
"""

from __future__ import annotations

from operator import attrgetter, itemgetter
from typing import Protocol

from scheduler_worker.backends.block_tables import BlockTables
from scheduler_worker.block_manager import BlockManager
from scheduler_worker.request import PLACEHOLDER, Request
from scheduler_worker.scheduled_batch import ScheduledBatch


class Scheduler(Protocol):
    """What these functions use of scheduler.Scheduler (named here, not imported: the
    scheduler imports this file)."""

    active: dict[str, tuple[Request, int]]
    block_size: int
    num_speculating: int
    num_visited: int

    blocks: BlockManager
    tables: BlockTables

    def _reserve(self, req: Request, n: int, batch: ScheduledBatch) -> bool: ...

    def _hash_blocks(self, req: Request) -> None: ...


_REQ, _RID, _SPECULATES = itemgetter(0), attrgetter("request_id"), attrgetter("speculates")


def take_decodes(sched: Scheduler, batch: ScheduledBatch, decodes: int, spare: int) -> int | None:
    """Every row of the active queue into batch's (empty) entries, one token each, where
    they all fit (`decodes`) and none may draft (`spare`: draft tokens this step): returns
    how many rows it took (a new block for those whose token starts one, preempting the
    newest rows if blocks run out, in row order as the row-by-row loop does); None,
    touching nothing, where that loop must run."""
    active = sched.active
    if len(active) > decodes or (
        # the active rows are live ones: none of those speculating, no row to look at
        spare > 0 and sched.num_speculating and any(map(_SPECULATES, map(_REQ, active.values())))
    ):
        return None
    entries = batch.entries
    entries.update(active)
    bs = sched.block_size
    needy = [r for r, _ in active.values() if r.num_computed_tokens >= len(r.block_table) * bs]
    if needy and extend_each(sched, needy):  # every one a block, from the free pool
        needy = []
    for req in needy:
        if req.request_id in entries:  # not preempted by an earlier row's _reserve
            sched._reserve(req, 1, batch)  # False: req itself preempted, its entry dropped
    sched.num_visited += len(entries)
    batch.decodes_kept = True
    return len(entries)


def extend_each(sched: Scheduler, reqs: list[Request]) -> bool:
    """One more block for each of reqs, their tokens starting a block this step, where
    each needs just the one and the pool has them all: the blocks Scheduler._reserve would
    give them row by row, in the same order, in one allocation and one table write (a
    batch that started together crosses a block at once). False, touching nothing, where
    not (_reserve must run, and may preempt)."""
    bs = sched.block_size
    if not sched.blocks.can_allocate(len(reqs)) or any(
        r.num_computed_tokens >= (len(r.block_table) + 1) * bs for r in reqs
    ):
        return False
    blocks = sched.blocks.allocate(len(reqs))
    sched.tables.append([r.slot for r in reqs], blocks)
    for req, block in zip(reqs, blocks):
        req.block_table.append(block)
    return True


def advance_decodes(
    sched: Scheduler,
    entries: list[tuple[Request, int]],
    out: list[tuple[Request, int]],
    kept: bool,
) -> None:
    """Scheduler.advance for the decode rows (one token each, every one sampling; no
    drafts, no sliding window), appended to `out` in order: each row's token counts as
    computed, it gets a placeholder and stays in (kept) or goes back to the end of the
    active queue, unless max_tokens ends it."""
    bs, ended = sched.block_size, []
    for row, (req, _) in enumerate(entries, len(out)):
        computed = req.num_computed_tokens = req.num_computed_tokens + 1
        # a placeholder's row fills no block (resolve hashes): only without one
        if not req.num_pending and computed // bs > req.num_hashed_blocks:
            sched._hash_blocks(req)
        tokens = req.token_ids
        index = len(tokens)
        out.append((req, index))
        tokens.append(PLACEHOLDER)
        req.output_token_ids.append(PLACEHOLDER)
        req.num_pending += 1
        req.flight_row = row
        if index + 1 - req.num_prompt_tokens >= req.max_tokens:
            ended.append(req)  # its last token: done when resolved
    active = sched.active
    if not kept:
        active.update(zip(map(_RID, map(_REQ, entries)), entries))
    for req in ended:
        active.pop(req.request_id, None)
