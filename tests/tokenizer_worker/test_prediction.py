"""OpenAI's `prediction` in the tokenizer worker: tokenized as output text (no special
tokens), carried to the scheduler as GenerateRequest.prediction_token_ids, and one longer
than the context refused with a 400 naming it."""

from __future__ import annotations

import dataclasses

import pytest

from common.messages import decode, encode, unpack_ids
from tests.tokenizer_worker.conftest import chat, completion, rejected
from tokenizer_worker.tokenization import Tokenization

pytestmark = pytest.mark.timeout(120)

CODE = "def load_items(path):\n    return [line.strip() for line in open(path)]\n"


def test_prediction_tokenized_and_carried(tok):
    req = dataclasses.replace(chat([{"role": "user", "content": "hi"}]), prediction=CODE)
    out = tok(req)
    assert (
        unpack_ids(out.prediction_token_ids)
        == tok.tokenizer.encode(CODE, add_special_tokens=False).ids
    )
    assert decode(encode(out)) == out  # through the wire
    assert tok(chat([{"role": "user", "content": "hi"}])).prediction_token_ids is None
    empty = tok(dataclasses.replace(completion("x"), prediction=""))
    assert unpack_ids(empty.prediction_token_ids) == []


def test_prediction_beyond_the_context_is_400(default_model_dir):
    tok = Tokenization(default_model_dir, max_model_len=32)
    text = "one two three four five six seven eight nine ten " * 4
    n = len(tok.tokenizer.encode(text, add_special_tokens=False).ids)
    assert n > 32
    e = rejected(tok, dataclasses.replace(completion("x"), prediction=text))
    assert e.param == "prediction" and str(n) in e.message and "32" in e.message
    fits = "one two three"
    assert tok(dataclasses.replace(completion("x"), prediction=fits)).prediction_token_ids
