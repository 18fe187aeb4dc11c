"""What the engine's step reports and keeps between steps: one RequestOutput per request that
produced a token or finished, the step in flight (overlapped scheduling), and where the
time went."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from scheduler_worker.request import Request
from scheduler_worker.sampling import DeviceSample, TokenLogprobs, prompt_logprob_entries
from scheduler_worker.spec.sampled import SampledVerify
from scheduler_worker.step_logprobs import RowLogprobs, token_logprobs


class RequestOutput(NamedTuple):
    """A tuple: the common row's is built in C (`new_output`), no frame a row a step."""

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


new_output = tuple.__new__  # new_output(RequestOutput, (all ten fields))
# a plain token's output: (request_id, [token], None (finish_reason), None (logprobs), the
# prompt's, the output's and the cached token counts, None, None, None (stop_token_id,
# stage_times, prompt_logprobs)): one tuple literal, no concatenation

# A step's output row (LLMEngine.step_rows): a RequestOutput, or for the common decode row
# (resolve_rows.py) a plain tuple of its ten fields in its order, read by index: an
# instance of a tuple subtype costs a generic allocation and deallocation, ~9% of the
# host's greedy step at 256 rows (docs/benchmarks.md, "The step's outputs as plain
# tuples"); its logprobs a RowLogprobs (step_logprobs.py). step() gives RequestOutputs
# (as_output), their logprobs as lists.
OutputRow = tuple


def as_output(row: tuple) -> RequestOutput:
    """A step's output row as a RequestOutput (the row itself where it is one), its
    logprobs as lists (a plain row's may be a RowLogprobs: step_logprobs.py)."""
    if type(row) is RequestOutput:
        return row
    if row[3] is not None and any(type(lp) is RowLogprobs for lp in row[3]):
        row = (*row[:3], list(map(token_logprobs, row[3])), *row[4:])
    return new_output(RequestOutput, row)


@dataclass
class InFlight:
    """A launched step whose tokens the host has not read yet."""

    sampled: list[tuple[Request, int]]  # (request, its placeholder's index), in row order
    sample: DeviceSample | None  # the tokens (and logprobs) on the device, being copied
    # rid -> (drafts, argmax at the positions before the last) of the rows that drafted
    drafts: dict[str, tuple[list[int], list[int]]] = field(default_factory=dict)
    # the rows that verify drafts by sampling (spec/sampled.py), their tokens on the device
    sampled_drafts: SampledVerify | None = None

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
        req.num_output_tokens,
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
