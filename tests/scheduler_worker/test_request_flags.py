"""A request's settled flags (Request.plain, Request.reads_history): read by the engine
for every row of every step in place of the per-step checks they replace."""

from __future__ import annotations

import pytest

from common.sampling_params import SamplingParams
from scheduler_worker.logits_processors import has_penalty
from scheduler_worker.request import Request
from scheduler_worker.sampling import Sampler, SamplingRow


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
    history = params.structured is not None or has_penalty(params) or req.wants_prompt_logprobs
    assert req.reads_history == history
    assert req.asks_prompt_logprobs == req.wants_prompt_logprobs  # none sent yet
    assert req.sampling_row == row  # its kept row: the one made afresh
