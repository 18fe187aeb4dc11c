"""Request limits: the unset max_tokens settled once, and what does not fit (the messages a
client sees are checked in tests/tokenizer_worker/test_tokenization.py)."""

from __future__ import annotations

import pytest

from common.limits import RequestLimits, RequestRejectedError, settle_max_tokens
from common.sampling_params import InvalidParameterError, SamplingParams


@pytest.mark.parametrize("cap, expected", [(None, 6), (4, 4), (16, 6)])
def test_an_unset_max_tokens_is_settled_to_the_room_the_prompt_leaves(cap, expected):
    """None (the client set none) becomes the room 10 prompt tokens leave of 16, at most
    the endpoint's cap; a client's max_tokens is kept, and refused if it does not fit."""
    params = SamplingParams(max_tokens=None, max_tokens_cap=cap)
    settle_max_tokens(params, 10, 16)
    assert (params.max_tokens, params.max_tokens_cap) == (expected, None)
    limits = RequestLimits(vocab_size=50, max_model_len=16)
    params = SamplingParams(max_tokens=None, max_tokens_cap=cap)
    limits.check([1] * 10, params)  # settled by the check itself
    assert params.max_tokens == expected
    with pytest.raises(RequestRejectedError, match="at most 6") as e:
        limits.check([1] * 10, SamplingParams(max_tokens=7))  # set by the client: kept
    assert e.value.param == "max_tokens"
    with pytest.raises(InvalidParameterError, match="6 tokens") as e:
        settle_max_tokens(SamplingParams(max_tokens=None, min_tokens=7), 10, 16)
    assert e.value.param == "min_tokens"


def test_what_does_not_fit():
    limits = RequestLimits(vocab_size=50, max_model_len=64, num_blocks=4, block_size=4)
    limits.check([1] * 8, SamplingParams(max_tokens=8))  # 16 tokens: the whole pool
    with pytest.raises(RequestRejectedError, match="5 KV blocks"):
        limits.check([1] * 8, SamplingParams(max_tokens=9))
    with pytest.raises(RequestRejectedError, match="too long") as e:
        limits.check([1] * 64, SamplingParams(max_tokens=1), where="messages")
    assert e.value.param == "messages"
    with pytest.raises(InvalidParameterError, match="empty"):
        limits.check([], SamplingParams())
    with pytest.raises(InvalidParameterError, match=r"\[50, -1\] are outside"):
        limits.check_token_ids([0, 50, 49, -1])
    limits.check_token_ids([])


def test_logit_bias_ids_must_lie_in_the_vocabulary():
    limits = RequestLimits(vocab_size=50, max_model_len=64)
    limits.check([1, 2], SamplingParams(logit_bias={0: -100, 49: 100}))
    with pytest.raises(InvalidParameterError, match=r"\[50\] are outside") as e:
        limits.check([1, 2], SamplingParams(logit_bias={3: 1.0, 50: -100}))
    assert e.value.param == "logit_bias"
