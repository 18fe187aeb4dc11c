"""A request's settled flags (Request.plain, Request.reads_history): read by the engine
for every row of every step in place of the per-step checks they replace; and the batch's
check for prompt logprobs owed, which reads the few requests that asked."""

from __future__ import annotations

import pytest

from common.sampling_params import SamplingParams
from scheduler_worker.batch_params import has_penalty
from scheduler_worker.request import Request, RequestStatus
from scheduler_worker.sampling import Sampler, SamplingRow
from scheduler_worker.scheduled_batch import ScheduledBatch


@pytest.mark.parametrize(
    "kw",
    [
        {"temperature": 0.0},
        {"top_k": 1, "temperature": 0.8},
        {"temperature": 0.7},
        {"temperature": 0.0, "logprobs": 2},
        {"temperature": 0.0, "logit_bias": {5: 1.0}},
        {"temperature": 0.0, "repetition_penalty": 1.2},
        {"temperature": 0.0, "presence_penalty": 0.5},
        {"temperature": 0.0, "min_tokens": 3},
        {"temperature": 0.0, "prompt_logprobs": 1},
        {"temperature": 0.0, "structured": {"kind": "json_object"}},
    ],
)
def test_a_requests_settled_flags_agree_with_the_per_step_checks(kw):
    """Request.plain / reads_history are settled once (the engine reads them for every
    row every step) and must agree with what they replace: Sampler.plain_greedy of the
    row before any output, and whether the row reads its tokens on the host first."""
    params = SamplingParams(max_tokens=4, **kw)
    req = Request("r", [1, 2, 3], params)
    row = SamplingRow(params, req.prompt_token_ids, req.output_token_ids)
    assert req.plain == (Sampler.plain_greedy([row]) and params.structured is None)
    assert Sampler.plain_greedy([req]) == Sampler.plain_greedy([row])  # its own row
    history = params.structured is not None or has_penalty(params) or req.wants_prompt_logprobs
    assert req.reads_history == history
    assert not hasattr(req, "__dict__")  # slots: its fields are read for every row a step


def test_a_batch_wants_prompt_logprobs_only_for_an_entry_still_owed_them():
    """ScheduledBatch.wants_prompt_logprobs looks at the requests that asked (the engine's
    list), not at the batch's rows: the answer is the old per-row check's, and the list
    drops those done with their prompt logprobs, or finished and out of the batch."""
    asks = SamplingParams(max_tokens=4, prompt_logprobs=1)
    plain = Request("plain", [1, 2], SamplingParams(max_tokens=4))
    owed, sent, gone = (Request(rid, [1, 2], asks) for rid in ("owed", "sent", "gone"))
    sent.prompt_logprobs_sent = True
    gone.status = RequestStatus.FINISHED_ABORTED
    asking = [owed, sent, gone]
    batch = ScheduledBatch({r.request_id: (r, 1) for r in (plain, sent)})
    assert not batch.wants_prompt_logprobs(asking)  # `owed` is not in it
    assert asking == [owed]
    batch.entries["owed"] = (owed, 1)
    assert batch.wants_prompt_logprobs(asking)
    other = Request("owed", [1, 2], asks)  # another request of the same id
    assert not ScheduledBatch({"owed": (other, 1)}).wants_prompt_logprobs([owed])
    assert not batch.wants_prompt_logprobs([])
