"""Drafting beside overlapped scheduling: which steps resolve the step in flight first.

Overlapped (a GPU), step N+1 is scheduled while step N's tokens are still on the device,
so no row knows its last token and none can draft (a drafter reads it). Where rows may
draft (a speculative method, or a request's `prediction`) the engine asks before it
schedules a step whether this one drafts: the policy's call (SpecPolicy.start_step, the
verify's measured cost against the plain step's, which overlapped is the overlapped
step's; asked for predictions too, which synchronously draft unasked: here one request's
prediction would cost every row its step's overlap). If so, the step in flight resolves
first and this step runs synchronously, its drafts verified at once (LLMEngine.step_rows).
A step whose rows found no draft goes in flight as any other, and each such try in a row
doubles the plain, overlapped steps before the next (up to MAX_WAIT): where little repeats
(chat) the steps stay overlapped but for a try now and then; where drafts are found
(edits, agents' JSON) every step verifies, as without overlap. SGLang's overlap scheduler
turned the overlap off beside speculation instead, as this engine did until now.
"""

from __future__ import annotations

from scheduler_worker.scheduled_batch import ScheduledBatch
from scheduler_worker.scheduler import Scheduler

MAX_WAIT = 64  # plain steps between tries at most, after tries that found no draft


class DraftGate:
    def __init__(self) -> None:
        self.misses = 0  # tries in a row whose rows found no draft
        self.wait = 0  # plain steps left before the next try
        self.tries = 0  # steps it let draft (the step in flight resolved first)

    def decide(self, sched: Scheduler) -> bool | None:
        """Before an overlapped step is scheduled: whether it drafts (the caller then
        resolves the step in flight first); None where no live row may draft (the
        scheduler's own call, which then finds no row)."""
        if not sched.num_speculating:
            return None
        if self.wait > 0:
            self.wait -= 1
            return False
        drafting = sched.drafting(overlapped=True)
        self.tries += drafting
        return drafting

    def settle(self, drafting: bool | None, batch: ScheduledBatch) -> None:
        """After a step that may have drafted: a try without drafts backs off."""
        if not drafting:
            return
        if batch.drafts:
            self.misses = 0
            return
        self.misses += 1
        self.wait = min(MAX_WAIT, (1 << self.misses) - 1)
