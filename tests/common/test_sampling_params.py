"""SamplingParams.logit_bias: its validation, and its way from JSON (from_dict) and over
the wire (an array of [id, bias] pairs: the decoder takes str map keys only)."""

from __future__ import annotations

import pytest

from common.messages import GenerateRequest, decode, encode
from common.sampling_params import (
    MAX_LOGIT_BIAS_ENTRIES,
    InvalidParameterError,
    SamplingParams,
)


def test_logit_bias_round_trips_from_json_and_over_the_wire():
    params = SamplingParams.from_dict({"logit_bias": {"0": -100, "1234": 100.0, "7": 0.5}})
    assert params.validate().logit_bias == {0: -100, 1234: 100.0, 7: 0.5}
    frame = decode(encode(GenerateRequest("r", b"", params, 0.0)))
    assert isinstance(frame, GenerateRequest)
    back = frame.params.validate()
    assert back.logit_bias == {0: -100, 1234: 100.0, 7: 0.5} and back == params
    assert (
        decode(encode(GenerateRequest("r", b"", SamplingParams(), 0.0))).params.logit_bias is None
    )


@pytest.mark.parametrize(
    ("bias", "match"),
    [
        ({"-1": 5}, "token ids"),
        ({"1.5": 5}, "token ids"),
        ({"abc": 5}, "token ids"),
        ({" 12": 5}, "token ids"),
        ({"²": 5}, "token ids"),  # a digit to str.isdigit, not a token id
        ({"9" * 40: 5}, "token ids"),
        ({"5": 100.5}, r"\[-100, 100\]"),
        ({"5": -101}, r"\[-100, 100\]"),
        ({"5": float("nan")}, r"\[-100, 100\]"),
        ({"5": float("inf")}, r"\[-100, 100\]"),
        ({"5": True}, r"\[-100, 100\]"),
        ({"5": "1"}, r"\[-100, 100\]"),
        ({str(i): 1 for i in range(MAX_LOGIT_BIAS_ENTRIES + 1)}, "at most 300"),
    ],
)
def test_bad_logit_bias_is_refused_naming_it(bias, match):
    with pytest.raises(InvalidParameterError, match=match) as e:
        SamplingParams.from_dict({"logit_bias": bias}).validate()
    assert e.value.param == "logit_bias"


def test_logit_bias_limits_and_int_keys():
    full = {str(i): 100 if i % 2 else -100 for i in range(MAX_LOGIT_BIAS_ENTRIES)}
    assert len(SamplingParams.from_dict({"logit_bias": full}).validate().logit_bias or {}) == 300
    SamplingParams(logit_bias={}).validate()
    for bad in ({-3: 1.0}, {True: 1.0}, {"5": 1.0}, [[5, 1.0]]):
        with pytest.raises(InvalidParameterError, match="logit_bias"):
            SamplingParams(logit_bias=bad).validate()  # type: ignore[arg-type]
