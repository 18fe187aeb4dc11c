"""Scheduling policy: which requests compute how many tokens in the next engine step.

Queues (waiting, prefilling: deques, a request that left dropped lazily at the front;
active: the decode batch kept between steps, decode_batch.py):

    waiting ──admit──▶ prefilling ──prompt done──▶ active (decode, round-robin)
       ▲                    │                          │
       └──── preempt (newest first, to the front) ◀────┘

Per-step work is bounded by the batch: at most `decode_batch` rows of the active queue,
the prefilling requests it schedules and admits, and each dead entry once.

A step is `schedule()`, the forward and sampling (the engine), then `update()`: the tokens
go into the requests, each finishing or going back to its queue. Overlapped, update() is
two halves, so that step N+1 is scheduled before step N's tokens reach the host:

    advance(batch)          right after the launch: the entries' tokens count as computed; a
                            sampling request gets a placeholder (-1, `num_pending`) and goes
                            back to the active queue, unless max_tokens ends it anyway
    resolve(req, i, token)  when the token is on the host: placeholder i becomes the token,
                            and the request finishes (stop token, max_tokens) or goes on

A request with a placeholder is not re-admitted (after a preemption) before its token is
resolved. Speculative decoding: spec/ (when drafts pay: policy.py; overlapped: overlap.py).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Sequence

from common.config import CacheConfig, SchedulerConfig
from scheduler_worker.backends.block_tables import BlockTables
from scheduler_worker.block_manager import BlockManager
from scheduler_worker.decode_batch import advance_decodes, take_decodes
from scheduler_worker.request import PLACEHOLDER, Request, RequestStatus
from scheduler_worker.scheduled_batch import ScheduledBatch
from scheduler_worker.spec import Drafter, drop_drafts, propose, settle_drafts
from scheduler_worker.spec.policy import SpecPolicy


class Scheduler:
    def __init__(
        self,
        sched: SchedulerConfig,
        cache: CacheConfig,
        num_blocks: int,
        eos_token_ids: Sequence[int] = (),
        sliding_window: int | None = None,
        drafter: Drafter | None = None,
    ) -> None:
        """sliding_window: every layer attends at most this many latest tokens; blocks
        wholly before it go back as a request advances (_free_outside_window), their
        entries `placeholder_block` (the runner's scratch block, never read)."""
        self.config, self.sliding_window = sched, sliding_window
        self.drafter, self.policy = drafter, SpecPolicy(sched.speculative_policy)  # spec/
        self.placeholder_block, self.block_size = num_blocks, cache.block_size
        self.eos_token_ids = list(eos_token_ids)
        self.blocks = BlockManager(num_blocks, cache.block_size, cache.enable_prefix_caching)
        # the running requests' tables, a row each (Request.slot), for the step's inputs
        self.tables = BlockTables(sched.num_seqs, pad=num_blocks)
        self.waiting: deque[Request] = deque()
        self.prefilling: deque[Request] = deque()  # admitted, their prompts in chunks
        self.active: dict[str, tuple[Request, int]] = {}  # decode rows: rid -> (req, 1)
        self.live: dict[str, Request] = {}  # requests holding blocks, in admission order
        self.num_waiting = 0  # requests in `waiting` that are still WAITING
        self.num_preemptions = 0
        self.num_speculating = 0  # requests in `live` that may draft (req.speculates)
        self.num_visited = 0  # queue entries touched by schedule(), for tests and stats

    @property
    def num_running(self) -> int:
        return len(self.live)

    def add(self, req: Request) -> None:
        p = req.params
        req.stop_tokens = frozenset(p.stop_token_ids or ()) | (
            frozenset() if p.ignore_eos else frozenset(self.eos_token_ids)
        )
        req.speculates &= self.drafter is not None or req.prediction is not None
        self.waiting.append(req)
        self.num_waiting += 1

    def schedule(self, drafting: bool | None = None) -> ScheduledBatch:
        """Decodes first (one token each, and drafts; round-robin over the active queue),
        then prompt chunks, then admissions (a free slot and its first chunk's blocks),
        within the step's token budget; a decode without a free block preempts the newest.
        `drafting`: whether rows may draft, decided already (drafting()), else here."""
        batch, budget = ScheduledBatch(), self.config.num_batched_tokens
        active, entries, bs = self.active, batch.entries, self.block_size
        decodes = min(self.config.decode_batch, budget)
        # tokens this step's drafts may take (few to learn or probe), a row's k at most
        spare, most = budget - decodes, self.config.num_speculative_tokens
        drafting = self.drafting() if drafting is None else drafting
        spare = min(spare, self.policy.cap) if drafting else 0
        taken = take_decodes(self, batch, decodes, spare)  # the usual step: every row at once
        num_decode = 0
        for req, _ in [] if taken is not None else list(active.values()):  # row by row
            if num_decode >= decodes:
                break
            self.num_visited += 1
            if req.status is not RequestStatus.RUNNING:
                continue  # preempted by an earlier row's _reserve
            del active[req.request_id]  # back at the end once advanced (round-robin)
            # a new block only when the token starts one (_reserve, inlined: every decode)
            if req.num_computed_tokens >= len(req.block_table) * bs and not self._reserve(
                req, 1, batch
            ):
                continue  # req itself was preempted
            n = 1
            if spare > 0 and req.speculates and not req.num_pending:
                n += self._draft(req, min(spare, most), batch)
                spare -= n - 1
            entries[req.request_id] = (req, n)
            num_decode += 1
        # entries, not num_decode: a row's _reserve may have preempted an earlier row
        batch.num_decode = len(entries)
        settle_drafts(self.policy, self.drafter, batch)  # a draft model's: in one batch
        budget -= batch.num_decode + sum(map(len, batch.drafts.values()))
        preemptions, admitted = self.num_preemptions, 0
        for req in list(self.prefilling):  # a copy: preemption may remove entries
            if budget <= 0:
                break
            if req.status is not RequestStatus.RUNNING:
                continue
            n = min(req.num_tokens - req.num_computed_tokens, budget)
            if not self._reserve(req, n, batch):
                break
            batch.entries[req.request_id] = (req, n)
            batch.num_prefill_tokens += n
            budget -= n
        while self.waiting and budget > 0 and len(self.live) < self.config.num_seqs:
            req = self.waiting[0]
            self.num_visited += 1
            if req.status is not RequestStatus.WAITING:
                self.waiting.popleft()
                continue
            n = 0 if req.num_pending else self._admit(req, budget)
            if n == 0:
                break
            self.waiting.popleft()
            self.num_waiting -= 1
            batch.entries[req.request_id] = (req, n)
            budget -= n
            admitted += n
        if self.num_preemptions == preemptions:
            batch.num_prefill_tokens += admitted
            return batch
        # preemption may have dropped entries: the drafts and counts of those still there
        batch.drafts = {r: d for r, d in batch.drafts.items() if r in entries}
        batch.num_decode = sum(1 for r, n in batch.entries.values() if not r.in_prefill_queue)
        batch.num_prefill_tokens = sum(n for r, n in batch.entries.values() if r.in_prefill_queue)
        return batch

    def drafting(self, overlapped: bool = False) -> bool:
        """Whether this step's decode rows may draft: the policy's call, once a step; a
        prediction (no drafter) drafts unasked unless the step gives up the overlap."""
        decodes = min(self.config.decode_batch, self.config.num_batched_tokens)
        asks = self.drafter is not None or overlapped
        return not asks or self.policy.start_step(min(decodes, len(self.active)))

    def _draft(self, req: Request, spare: int, batch: ScheduledBatch) -> int:
        """Drafts for decode row req: at most `spare`, none past its max_tokens, and only
        into blocks free now (a draft never preempts). Returns how many."""
        k = self.policy.row_tokens(req, min(spare, req.max_tokens - req.num_output_tokens - 1))
        if k <= 0:
            return 0
        drafts = propose(req, self.drafter, k, self.policy.probing)
        end = req.num_computed_tokens + 1 + len(drafts)
        need = self._blocks_needed(len(req.block_table), end)
        if need and not self.blocks.can_allocate(need):
            drafts = drafts[: len(req.block_table) * self.block_size - end + len(drafts)]
        elif need:
            self._extend(req, self.blocks.allocate(need))
        if drafts:
            batch.drafts[req.request_id] = drafts
        return len(drafts)

    def _admit(self, req: Request, budget: int) -> int:
        # prompt logprobs need the logits of every prompt position: no cached prefix then
        blocks, num_cached = (
            ([], 0) if req.wants_prompt_logprobs else self.blocks.match_prefix(req.token_ids)
        )
        n = min(req.num_tokens - num_cached, budget)
        need = self._blocks_needed(len(blocks), num_cached + n)
        if not self.blocks.can_allocate(need):
            self.blocks.free(blocks)
            return 0
        req.block_table = blocks + self.blocks.allocate(need)
        req.slot = self.tables.take()
        self.tables.write(req.slot, 0, req.block_table)
        req.num_computed_tokens = req.num_cached_tokens = num_cached
        req.num_hashed_blocks = len(blocks)
        req.status = RequestStatus.RUNNING
        req.resolves_inline = req.first_token_time is not None and not req.resolves_apart
        if req.first_scheduled_time is None:
            req.first_scheduled_time = time.monotonic()
        self.live[req.request_id] = req
        self.num_speculating += req.speculates
        self.prefilling.append(req)
        req.in_prefill_queue = True
        return n

    def _blocks_needed(self, have: int, num_tokens: int) -> int:
        return max(0, -(-num_tokens // self.block_size) - have)

    def _reserve(self, req: Request, n: int, batch: ScheduledBatch) -> bool:
        """Make req's block table cover n more tokens, preempting the newest requests
        when blocks run out. False if req could not be served this step."""
        need = self._blocks_needed(len(req.block_table), req.num_computed_tokens + n)
        while not self.blocks.can_allocate(need):
            victim = next(reversed(self.live.values()))
            self.preempt(victim)
            batch.entries.pop(victim.request_id, None)
            if victim is req:
                return False
        if need:
            self._extend(req, self.blocks.allocate(need))
        return True

    def _extend(self, req: Request, blocks: list[int]) -> None:
        self.tables.write(req.slot, len(req.block_table), blocks)
        req.block_table.extend(blocks)

    def preempt(self, req: Request) -> None:
        """Recompute-style preemption: drop the KV, keep the tokens, requeue at the front."""
        self._release(req)
        req.status = RequestStatus.WAITING
        req.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(req)
        self.num_waiting += 1

    def _release(self, req: Request) -> None:
        drop_drafts(self.drafter, req)  # a draft model's KV for it
        self.blocks.free(req.block_table[req.num_freed_blocks :])
        req.block_table = []
        if req.slot >= 0:
            self.tables.give(req.slot)
            req.slot = -1
        req.num_computed_tokens = req.num_hashed_blocks = req.num_freed_blocks = 0
        req.resolves_inline = False  # preempted or finished: no longer running
        self.active.pop(req.request_id, None)
        if self.live.pop(req.request_id, None) is not None:
            self.num_speculating -= req.speculates
        if req.in_prefill_queue:
            self.prefilling.remove(req)  # short deque: requests mid-prompt
            req.in_prefill_queue = False

    def finish(self, req: Request, status: RequestStatus) -> None:
        if req.status is RequestStatus.RUNNING:
            self._release(req)
        elif req.status is RequestStatus.WAITING:
            self.num_waiting -= 1  # its queue entry is dropped lazily
        req.status, req.finished_time = status, time.monotonic()
        if self.drafter is not None:  # what later requests may repeat (spec/suffix.py)
            self.drafter.observe(req.prompt_token_ids, req.output_token_ids)

    def update(self, batch: ScheduledBatch, token_ids: Sequence[int]) -> list[Request]:
        """After the forward: every entry's tokens are in the KV cache, and the requests that
        sampled (batch.sampling(), in entry order) get one token each from token_ids: each finishes
        (_finish_status) and frees its blocks, or decodes on; returns them in entry order
        (admission, common.limits, keeps prompt + max_tokens within the context)."""
        sampled = self.advance(batch)
        if len(token_ids) != len(sampled):
            raise ValueError(f"{len(token_ids)} sampled tokens for {len(sampled)} requests")
        for (req, index), token in zip(sampled, token_ids):
            self.resolve(req, index, token)
        return [req for req, _ in sampled]

    def advance(
        self, batch: ScheduledBatch, sampling: list[bool] | None = None
    ) -> list[tuple[Request, int]]:
        """The first half of update(), once the step is launched: the entries' tokens count
        as computed, and each request that samples gets a placeholder token and stays in
        the active queue (not when max_tokens ends it whatever the token). Returns
        (request, index of its placeholder), in entry order. `sampling`: batch.sampling()."""
        entries = list(batch.entries.values())
        if sampling is None:
            sampling = batch.sampling()
        out: list[tuple[Request, int]] = []
        active, window, bs = self.active, self.sliding_window is not None, self.block_size
        if batch.drafts:  # a drafted row's drafts count once accepted
            entries = [(r, 1 if r.request_id in batch.drafts else n) for r, n in entries]
        elif not window and batch.num_decode:  # the decode rows at once, the rest row by row
            advance_decodes(self, entries[: batch.num_decode], out, batch.decodes_kept)
            entries, sampling = entries[batch.num_decode :], sampling[batch.num_decode :]
        for (req, n), sample in zip(entries, sampling):
            # _advance, inlined: every row (a placeholder's row fills no block: resolve hashes)
            computed = req.num_computed_tokens = req.num_computed_tokens + n
            if not req.num_pending and computed // bs > req.num_hashed_blocks:
                self._hash_blocks(req)
            if window:
                self._free_outside_window(req)
            if not sample:
                continue
            tokens = req.token_ids
            index = len(tokens)
            req.flight_row = len(out)
            out.append((req, index))
            tokens.append(PLACEHOLDER)
            req.output_token_ids.append(PLACEHOLDER)
            req.num_pending += 1
            if req.in_prefill_queue:  # its first token: it decodes from now on
                self._leave_prefill_queue(req)
            if index + 1 - req.num_prompt_tokens < req.max_tokens:
                active[req.request_id] = (req, 1)  # a row kept in place stays there
            else:
                active.pop(req.request_id, None)  # its last token: done when resolved
        return out

    def resolve(self, req: Request, index: int, token: int) -> RequestStatus | None:
        """The second half: placeholder `index` of req's token_ids is `token`; the request
        finishes if the token ends it (its status, blocks freed), else None. One finished
        meanwhile (an abort, a stop at an earlier placeholder) only drops its placeholders."""
        req.num_pending -= 1
        if req.status.finished:
            del req.token_ids[index:], req.output_token_ids[index - req.num_prompt_tokens :]
            return None
        req.token_ids[index] = token
        n_out = index + 1 - req.num_prompt_tokens
        req.output_token_ids[n_out - 1] = token
        if req.status is RequestStatus.RUNNING:  # _hash_blocks' test, inlined: every row
            known = min(req.num_computed_tokens, len(req.token_ids) - req.num_pending)
            if known // self.block_size > req.num_hashed_blocks:
                self._hash_blocks(req)
        if req.first_token_time is None:
            req.first_token_time = time.monotonic()
            req.resolves_inline = req.status is RequestStatus.RUNNING and not req.resolves_apart
        if token not in req.stop_tokens and n_out < req.max_tokens:
            return None  # most rows: neither a stop token nor the last
        status = self._finish_status(req, token, n_out)
        if status is not None:
            self.finish_at(req, index, status)
        return status

    def finish_at(self, req: Request, index: int, status: RequestStatus) -> None:
        """finish() with token `index` its last: no placeholder after it (steps in flight)."""
        del req.token_ids[index + 1 :], req.output_token_ids[index + 1 - req.num_prompt_tokens :]
        self.finish(req, status)

    def accept(self, req: Request, index: int, tokens: list[int]) -> list[int]:
        """resolve() of a verified row's accepted tokens one by one (a stop or max_tokens cuts
        the run); returns those kept. Rejected drafts' K/V lies past num_computed_tokens."""
        self.resolve(req, index, tokens[0])
        kept = tokens[:1]
        for token in tokens[1:]:
            if req.status.finished:
                break
            req.num_computed_tokens += 1  # the accepted draft before this token
            req.token_ids.append(PLACEHOLDER)
            req.output_token_ids.append(PLACEHOLDER)
            req.num_pending += 1
            self.resolve(req, len(req.token_ids) - 1, token)
            kept.append(token)
        return kept

    def _finish_status(self, req: Request, token: int, n_out: int) -> RequestStatus | None:
        """A stop token (an EOS unless ignore_eos, or one of stop_token_ids) once min_tokens
        are out (n_out: the outputs up to and with this token); else max_tokens."""
        p = req.params
        is_stop = token in p.stop_token_ids or (not p.ignore_eos and token in self.eos_token_ids)
        if is_stop and n_out >= p.min_tokens:
            if token in p.stop_token_ids:  # vLLM's stop_reason (an EOS stop has none)
                req.stop_token_id = token
            return RequestStatus.FINISHED_STOPPED
        if n_out >= req.max_tokens:
            return RequestStatus.FINISHED_LENGTH
        return None

    def _hash_blocks(self, req: Request) -> None:
        """Register req's filled blocks, all tokens known (not a placeholder's), as cached."""
        known = min(req.num_computed_tokens, len(req.token_ids) - req.num_pending)
        if known // self.block_size > req.num_hashed_blocks:  # a block filled
            req.num_hashed_blocks = self.blocks.cache_full_blocks(
                req.block_table, req.token_ids, req.num_hashed_blocks, known
            )

    def _free_outside_window(self, req: Request) -> None:
        """Give back the blocks no later query reads (the next query at p reads keys >
        p - window: block i is done once (i + 1) * block_size <= p - window + 1), but the
        last hashed one (the prefix chain starts from its hash); a freed block keeps its
        hash on the free list, for a later request with that prefix until evicted."""
        assert self.sliding_window is not None
        done = (req.num_computed_tokens - self.sliding_window + 1) // self.block_size
        upto = min(done, req.num_hashed_blocks - 1)
        if upto <= req.num_freed_blocks:
            return
        table = req.block_table
        self.blocks.free(table[req.num_freed_blocks : upto])
        gone = [self.placeholder_block] * (upto - req.num_freed_blocks)
        table[req.num_freed_blocks : upto] = gone
        self.tables.write(req.slot, req.num_freed_blocks, gone)
        req.num_freed_blocks = upto

    def _leave_prefill_queue(self, req: Request) -> None:
        q = self.prefilling
        q.popleft() if q[0] is req else q.remove(req)  # most often the first
        req.in_prefill_queue = False
