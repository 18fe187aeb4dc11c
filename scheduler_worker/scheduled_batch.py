"""What one engine step computes: Scheduler.schedule()'s result, read by the engine."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from operator import attrgetter

from scheduler_worker.request import Request

_FLIGHT_ROW = attrgetter("flight_row")


@dataclass
class ScheduledBatch:
    entries: dict[str, tuple[Request, int]] = field(
        default_factory=dict
    )  # rid -> (req, num_new_tokens)
    num_decode: int = 0  # entries from the active queue (one token each)
    num_prefill_tokens: int = 0  # tokens of prompt chunks
    # rid -> the tokens drafted for that decode row (its entry computes 1 + len of them)
    drafts: dict[str, list[int]] = field(default_factory=dict)
    # the decode rows stayed in the scheduler's active queue, in place (decode_batch.py)
    decodes_kept: bool = False

    def __len__(self) -> int:
        return len(self.entries)

    def drop(self, req: Request) -> bool:
        """Take req's entry out (its counts with it: the decodes are the first num_decode
        entries); False if it had none."""
        if req.request_id not in self.entries:
            return False
        # every entry a decode (a decode-only step: the rows finished meanwhile) needs no
        # look for the row's place (a pass over the entries, ~3.7 µs a row at 256 rows)
        if self.num_decode == len(self.entries) or (
            list(self.entries).index(req.request_id) < self.num_decode
        ):
            self.num_decode -= 1
        else:
            self.num_prefill_tokens -= self.entries[req.request_id][1]
        del self.entries[req.request_id]
        self.drafts.pop(req.request_id, None)
        return True

    def cut_drafts(self, req: Request, n: int) -> None:
        """Keep the first n of req's drafts (none: a plain decode row); the blocks taken
        for the others stay in its table, as a rejected draft's do."""
        drafts = self.drafts[req.request_id][:n]
        if drafts:
            self.drafts[req.request_id] = drafts
        else:
            del self.drafts[req.request_id]
        self.entries[req.request_id] = (req, 1 + n)

    def sampling(self) -> list[bool]:
        """Per entry: its chunk reaches the request's last token, so the request samples
        one token after the forward (the last prompt chunk, and every decode: the first
        num_decode entries). Read it before update()."""
        head = [True] * self.num_decode
        rest = list(self.entries.values())[self.num_decode :]
        return head + [req.num_computed_tokens + n == req.num_tokens for req, n in rest]

    def grammar_waits(self, constrained: Iterable[str]) -> list[Request]:
        """The rows whose grammar needs the token the step in flight is sampling, in the
        order of that step's rows. `constrained`: the ids of the requests with a grammar
        (GrammarMatchers), a few: looked up here, not found by a pass over the rows (three
        C passes over 256 rows were ~4% of the chat mix's host step in instructions)."""
        entries = self.entries
        found = (entries.get(rid) for rid in constrained)
        waits = [e[0] for e in found if e is not None and e[0].num_pending]
        return sorted(waits, key=_FLIGHT_ROW) if len(waits) > 1 else waits

    def wants_prompt_logprobs(self, asking: list[Request]) -> bool:
        """Some entry's prompt logprobs are still to be computed. `asking`: the requests
        that asked for them (LLMEngine.add_request), pruned here in place of those done
        with them: a step looks at those few, not at its rows (a pass over 256 rows was
        ~3% of the host's step in instructions)."""
        if not asking:
            return False
        entries = self.entries
        asking[:] = [
            req
            for req in asking
            if req.wants_prompt_logprobs and (not req.status.finished or req.request_id in entries)
        ]
        return any(entries.get(req.request_id, (None,))[0] is req for req in asking)

    def resolves_first(self, overlap: bool, asking: list[Request]) -> bool:
        """The step in flight must be resolved before this one launches: not overlapped,
        or this step has drafts (its rows' next positions depend on what it accepts), or
        prompt logprobs to compute (wants_prompt_logprobs)."""
        return not overlap or bool(self.drafts) or self.wants_prompt_logprobs(asking)
