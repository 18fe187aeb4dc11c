"""What the engine's step reports and keeps between steps: one RequestOutput per request that
produced a token or finished, the step in flight (overlapped scheduling), and where the
time went."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import NamedTuple

from scheduler_worker.request import Request
from scheduler_worker.sampling import (
    DeviceSample,
    SamplerOutput,
    TokenLogprobs,
    prompt_logprob_entries,
)
from scheduler_worker.spec.sampled import SampledVerify
from scheduler_worker.step_logprobs import RowLogprobs, token_logprobs


class RequestOutput(NamedTuple):
    """A request's output of a step; the common row's fields go straight into the step's
    OutputColumns, with no record of their own."""

    request_id: str
    new_token_ids: list[int]
    finish_reason: str | None = None  # "stop" | "length" | "abort"
    logprobs: list[TokenLogprobs] | None = None
    num_prompt_tokens: int = 0
    num_output_tokens: int = 0
    num_cached_tokens: int = 0
    stop_token_id: int | None = None  # finished by this entry of stop_token_ids (its last token)
    # on the finishing output only: monotonic stage times and counts (see Request)
    stage_times: dict[str, float | None] | None = None  # None: a stage it never reached
    # params.prompt_logprobs, with the first token only: Request.prompt_logprobs
    prompt_logprobs: list[list | None] | None = None


class OutputColumns:
    """A step's outputs (LLMEngine.step_rows), row by row in the step's order, kept as
    columns of RequestOutput's fields: the common decode row (resolve_rows.py) appends its
    own to them, no record a row, and the message (step_message.py) sends the columns as
    they are. A tuple a row cost its build, a list for its one token, the transpose back
    to columns and their deallocation, ~0.25 µs a row (docs/benchmarks.md, "A step's
    outputs as columns"). A row resolved apart comes as its RequestOutput (`add`), kept
    whole where it has a field past the columns (a finish, prompt logprobs). Logprobs are
    kept by row, for the few rows that have some: a row without adds nothing to them.
    `outputs()` names every row (LLMEngine.step)."""

    __slots__ = (
        "request_ids",
        "token_ids",
        "logprobs",
        "num_prompt",
        "num_output",
        "num_cached",
        "counts",
        "apart",
    )

    def __init__(self) -> None:
        self.request_ids: list[str] = []
        self.token_ids: list[int] = []  # every row's new tokens, one row after another
        # row -> its logprobs, one entry a new token, for the rows that have some (the
        # few that ask): a row without adds nothing
        self.logprobs: dict[int, list] = {}
        self.num_prompt: list[int] = []
        self.num_output: list[int] = []
        self.num_cached: list[int] = []
        self.counts: dict[int, int] = {}  # row -> its number of new tokens, where not 1
        self.apart: dict[int, RequestOutput] = {}  # row -> its output, where it finishes
        # or carries prompt logprobs (the fields past the columns)

    def __len__(self) -> int:
        return len(self.request_ids)

    @classmethod
    def of(cls, outputs: list[RequestOutput]) -> OutputColumns:
        columns = cls()
        deque(map(columns.add, outputs), 0)
        return columns

    def add(self, out: RequestOutput) -> None:
        """A row as its RequestOutput (one resolved apart, an abort)."""
        i = len(self.request_ids)
        self.request_ids.append(out.request_id)
        n = len(out.new_token_ids)
        self.token_ids += out.new_token_ids
        if n != 1:
            self.counts[i] = n
        if out.logprobs is not None:
            self.logprobs[i] = out.logprobs
        self.num_prompt.append(out.num_prompt_tokens)
        self.num_output.append(out.num_output_tokens)
        self.num_cached.append(out.num_cached_tokens)
        if (
            out.finish_reason is not None
            or out.stop_token_id is not None
            or out.stage_times is not None
            or out.prompt_logprobs is not None
        ):
            self.apart[i] = out

    def outputs(self) -> list[RequestOutput]:
        """Every row as a RequestOutput, its logprobs as lists (a common row's may be
        RowLogprobs: step_logprobs.py)."""
        rows: list[RequestOutput] = []
        at, counts, apart = 0, self.counts, self.apart
        for i, rid in enumerate(self.request_ids):
            n = counts.get(i, 1)
            kept = apart.get(i)
            lps = self.logprobs.get(i)
            if lps is not None and any([type(lp) is RowLogprobs for lp in lps]):
                lps = list(map(token_logprobs, lps))
            if kept is not None:
                rows.append(kept._replace(logprobs=lps))
            else:
                tokens = self.token_ids[at : at + n]
                rows.append(
                    RequestOutput(
                        rid,
                        tokens,
                        None,
                        lps,
                        self.num_prompt[i],
                        self.num_output[i],
                        self.num_cached[i],
                    )
                )
            at += n
        return rows


@dataclass
class InFlight:
    """A launched step whose tokens the host has not read yet."""

    sampled: list[tuple[Request, int]]  # (request, its placeholder's index), in row order
    sample: DeviceSample | None  # the tokens (and logprobs) on the device, being copied
    # rid -> (drafts, argmax at the positions before the last) of the rows that drafted
    drafts: dict[str, tuple[list[int], list[int]]] = field(default_factory=dict)
    # the rows that verify drafts by sampling (spec/sampled.py), their tokens on the device
    sampled_drafts: SampledVerify | None = None
    # its tokens on the host, read before its resolve (LLMEngine._launch: grammar masks)
    host: SamplerOutput | None = None

    @property
    def verifies(self) -> bool:
        """Some row verified drafts: its next position waits for what it accepts."""
        return bool(self.drafts) or self.sampled_drafts is not None


@dataclass
class StepStats:
    """Where the last step's time went (seconds)."""

    schedule: float = 0.0
    forward: float = 0.0
    sample: float = 0.0
    num_decode: int = 0
    num_prefill_tokens: int = 0


@dataclass
class EngineCounters:
    num_steps: int = 0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    draft_tokens: int = 0  # speculative decoding: tokens drafted, and accepted of them
    accepted_tokens: int = 0
    verify_steps: int = 0  # steps that verified drafts
    busy_time: dict[str, float] = field(
        default_factory=lambda: {"schedule": 0.0, "forward": 0.0, "sample": 0.0}
    )


def request_output(req: Request, tokens: list[int], logprobs=None) -> RequestOutput:
    """What a step reports of a request: its new tokens, and on its finishing output the
    reason, stage times and counts."""
    reason = req.status.value if req.status.finished else None
    stages = None
    if reason is not None:
        stages = {
            "received": req.arrival_time,
            "first_scheduled": req.first_scheduled_time,
            "first_token": req.first_token_time,
            "finished": req.finished_time,
            "num_cached_tokens": req.num_cached_tokens,
            "num_preemptions": req.num_preemptions,
        }
        if req.num_draft_tokens:
            stages["num_draft_tokens"] = req.num_draft_tokens
            stages["num_accepted_tokens"] = req.num_accepted_tokens
        if req.prediction is not None:  # OpenAI's usage counts (spec/prediction.py)
            req.prediction.advance(req.token_ids)
            stages["accepted_prediction_tokens"] = req.prediction.num_matched
            stages["rejected_prediction_tokens"] = req.prediction.num_rejected
    return RequestOutput(
        req.request_id,
        tokens,
        reason,
        logprobs,
        req.num_prompt_tokens,
        # the tokens out so far: a running row's placeholders (steps in flight) are not
        # (a finished one's were cut: Scheduler.finish_at)
        req.num_output_tokens - (0 if reason is not None else req.num_pending),
        req.num_cached_tokens,
        req.stop_token_id if reason is not None else None,
        stages,
    )


def last_output(req: Request, token: int, lp: TokenLogprobs | None) -> RequestOutput:
    """The output of a row that finished, or that may send its prompt logprobs (they go
    with its first token once its prompt is done)."""
    out = request_output(req, [token], [lp] if lp is not None else None)
    if req.reads_history and req.wants_prompt_logprobs:
        first: list = [req.prompt_token_ids[0], None, []]  # a 1-token prompt: this
        out = out._replace(prompt_logprobs=req.prompt_logprobs or [first])
        req.prompt_logprobs = None
        req.prompt_logprobs_sent = True
    return out


def keep_prompt_logprobs(
    entries: list[tuple[Request, int]], prompt_logits: list, vocab_size: int
) -> None:
    """Each chunk's prompt logprobs into its request (positions start + 1 ...)."""
    for (req, _), rows in zip(entries, prompt_logits):
        if rows is None:
            continue
        if req.prompt_logprobs is None:  # position 0 has no logprob (OpenAI's null)
            req.prompt_logprobs = [None] * req.num_prompt_tokens
            req.prompt_logprobs[0] = [req.prompt_token_ids[0], None, []]
        start = req.num_computed_tokens + 1
        targets = req.prompt_token_ids[start : start + len(rows)]
        k = req.params.prompt_logprobs or 0
        got = prompt_logprob_entries(rows[:, :vocab_size], targets, k)
        req.prompt_logprobs[start : start + len(got)] = got
