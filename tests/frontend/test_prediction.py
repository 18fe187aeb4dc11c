"""OpenAI's `prediction` at the frontend's intake (frontend/prediction.py) and in the
usage (frontend/api/openai_usage.py): the shapes OpenAI takes, the ones it refuses (400
naming the field), n > 1 refused, and the accepted / rejected counts as OpenAI reports them."""

from __future__ import annotations

import json

import pytest

from frontend.api.openai_format import Choice
from frontend.api.openai_protocol import ChatCompletionRequest, CompletionRequest
from frontend.api.openai_usage import usage
from frontend.errors import APIError
from frontend.intake import parse
from frontend.prediction import prediction_counts, prediction_text

MESSAGES = [{"role": "user", "content": "hi"}]


def _chat(**extra) -> ChatCompletionRequest:
    return parse(ChatCompletionRequest, json.dumps({"messages": MESSAGES, **extra}).encode())


def test_shapes_openai_takes():
    req = _chat(prediction={"type": "content", "content": "abc"})
    assert prediction_text(req.prediction, 1) == "abc"
    parts = [{"type": "text", "text": "ab"}, {"type": "text", "text": "c"}]
    assert (
        prediction_text(_chat(prediction={"type": "content", "content": parts}).prediction, 1)
        == "abc"
    )
    assert prediction_text(_chat().prediction, 1) is None
    assert prediction_text(_chat(prediction=None).prediction, 4) is None
    body = {"prompt": "x", "prediction": {"type": "content", "content": "abc"}}
    cmpl = parse(CompletionRequest, json.dumps(body).encode())
    assert prediction_text(cmpl.prediction, 1) == "abc"


@pytest.mark.parametrize(
    "prediction, param",
    [
        ({"type": "text", "content": "x"}, "prediction.type"),
        ({"content": "x"}, "prediction.type"),
        ({"type": "content"}, "prediction.content"),
        ({"type": "content", "content": None}, "prediction.content"),
        (
            {"type": "content", "content": [{"type": "image_url", "text": "x"}]},
            "prediction.content",
        ),
        ({"type": "content", "content": [{"type": "text"}]}, "prediction.content"),
        ({"type": "content", "content": "x", "more": 1}, "prediction.more"),
        ("x", "prediction"),
        ([], "prediction"),
    ],
)
def test_wrong_shapes_are_400s_naming_the_field(prediction, param):
    with pytest.raises(APIError) as e:
        _chat(prediction=prediction)
    # (a union names the branch pydantic reports first: the field, or a part of it)
    assert e.value.status == 400 and (e.value.param or "").startswith(param), e.value.message


def test_more_than_one_choice_refused():
    req = _chat(prediction={"type": "content", "content": "abc"}, n=2)
    with pytest.raises(APIError) as e:
        prediction_text(req.prediction, 2)
    assert e.value.status == 400 and e.value.param == "n"


def test_usage_counts_as_openai():
    c = Choice(0)
    c.num_prompt_tokens, c.num_output_tokens = 10, 20
    assert "completion_tokens_details" not in usage([c])
    c.prediction = prediction_counts(
        {"accepted_prediction_tokens": 15, "rejected_prediction_tokens": 7}
    )
    u = usage([c])
    assert u["completion_tokens_details"] == {
        "accepted_prediction_tokens": 15,
        "rejected_prediction_tokens": 7,
    }
    # the rejected tokens are billed as completion tokens
    assert u["completion_tokens"] == 27 and u["total_tokens"] == 37
    c.num_reasoning_tokens = 3
    assert usage([c], reasoning=True)["completion_tokens_details"]["reasoning_tokens"] == 3
    assert prediction_counts(None) is None
    assert prediction_counts({"accepted_prediction_tokens": 1}) is None
    assert (
        prediction_counts({"accepted_prediction_tokens": "1", "rejected_prediction_tokens": 0})
        is None
    )
