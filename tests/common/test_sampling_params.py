"""SamplingParams on the wire (a typed struct: an array of its fields) and its logit_bias:
its validation, and its way from JSON (from_dict) and over the wire (an array of
[id, bias] pairs: the decoder takes str map keys only)."""

from __future__ import annotations

import dataclasses

import msgpack
import pytest

from common.messages import GenerateRequest, WireError, decode, encode, pack_ids
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


def test_sampling_params_travel_as_a_typed_struct():
    """SamplingParams is one shape from intake to the engine: an array of its fields on
    the wire (logit_bias as [id, bias] pairs), the same dataclass after decode, an unset
    max_tokens (None) and its cap included; its wire form is no message value."""
    params = SamplingParams(
        max_tokens=None,
        max_tokens_cap=16,
        seed=2**64 - 1,
        stop=["a", "b"],
        stop_token_ids=[2],
        logit_bias={0: -100, 49151: 2.5},
        structured={"kind": "json", "spec": "{}"},
        logprobs=3,
    )
    frame = encode(GenerateRequest("r", pack_ids([0, 1, 49151]), params, 1.0))
    wire = msgpack.unpackb(frame)[4]
    assert isinstance(wire, list) and len(wire) == len(dataclasses.fields(SamplingParams))
    assert wire[-1] == [[0, -100.0], [49151, 2.5]]  # logit_bias, the last field
    back = decode(frame).params
    assert isinstance(back, SamplingParams) and back == params
    assert back.logit_bias == {0: -100.0, 49151: 2.5}
    with pytest.raises(WireError, match="not packable"):
        encode(GenerateRequest("r", pack_ids([0, 1, 49151]), wire, 1.0))  # type: ignore[arg-type]
