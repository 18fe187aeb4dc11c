"""Request limits: the unset max_tokens at each hop, and what does not fit (the messages a
client sees are checked in tests/tokenizer_worker/test_tokenization.py)."""

from __future__ import annotations

import pytest

from common.limits import RequestLimits, RequestRejectedError, max_tokens_for
from common.sampling_params import INT64_MAX, InvalidParameterError, SamplingParams


def test_max_tokens_for_an_unset_one_before_the_prompt_is_known():
    assert max_tokens_for(5, 16, 100) == 5  # the client's wins
    assert max_tokens_for(None, 16) == 16  # the endpoint's default
    assert max_tokens_for(None, None, 100) == 100  # else the context (tokenizer)
    assert max_tokens_for(None, None) == INT64_MAX  # the frontend knows no context


def test_unset_max_tokens_is_cut_to_the_room_the_prompt_leaves():
    limits = RequestLimits(vocab_size=50, max_model_len=16)
    params = SamplingParams(max_tokens=max_tokens_for(None, None, 16))
    limits.check([1] * 10, params, max_tokens_unset=True)
    assert params.max_tokens == 6
    with pytest.raises(RequestRejectedError, match="at most 6") as e:
        limits.check([1] * 10, SamplingParams(max_tokens=7))  # set by the client: kept
    assert e.value.param == "max_tokens"


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
