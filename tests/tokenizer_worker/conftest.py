"""Shared by the tokenizer worker tests: request builders, the default model's
Tokenization and its transformers tokenizer, and conversations to render."""

from __future__ import annotations

import pytest

from common.messages import TokenizeRequest, pack_ids
from common.sampling_params import SamplingParams
from tokenizer_worker.tokenization import Rejected, Tokenization

CONVERSATIONS = {
    "system+user": [
        {"role": "system", "content": "You are a terse assistant."},
        {"role": "user", "content": "What is the capital of France?"},
    ],
    "user-only": [{"role": "user", "content": "Hello!"}],
    "multi-turn": [
        {"role": "system", "content": "Answer in one word."},
        {"role": "user", "content": "Sky colour?"},
        {"role": "assistant", "content": "Blue."},
        {"role": "user", "content": "And grass?"},
        {"role": "assistant", "content": "Green."},
        {"role": "user", "content": "Snow?"},
    ],
    "unicode": [
        {"role": "user", "content": "你好，世界！今天天气怎么样？"},
        {"role": "assistant", "content": "Party 🎉🎊 family 👨‍👩‍👧‍👦 café naïve Ωμέγα"},
        {"role": "user", "content": "  leading spaces, tabs\tand\nnewlines\n\n"},
    ],
    "empty-content": [{"role": "user", "content": ""}],
    "template-lookalike": [{"role": "user", "content": "{{ 7 * 7 }} {% raise %} <|im_end|>"}],
}


def hf_chat_ids(hf_tok, messages: list[dict]) -> list[int]:
    out = hf_tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    if not isinstance(out, list):  # transformers 5: a BatchEncoding
        out = out["input_ids"]
    return list(out)


def intake(params: dict | None) -> SamplingParams:
    """The params as the frontend's intake sends them: a max_tokens the client did not set
    left unset (None), for the tokenizer to settle."""
    return SamplingParams.from_dict({"max_tokens": None, **(params or {})})


def chat(messages, params=None, rid="chat-1") -> TokenizeRequest:
    return TokenizeRequest(rid, "chat", None, None, messages, intake(params))


def completion(prompt=None, ids=None, params=None, rid="cmpl-1") -> TokenizeRequest:
    packed = pack_ids(ids) if isinstance(ids, list) else ids
    return TokenizeRequest(rid, "completion", prompt, packed, None, intake(params))


def rejected(tok: Tokenization, req: TokenizeRequest) -> Rejected:
    with pytest.raises(Rejected) as info:
        tok(req)
    assert info.value.status == 400 and info.value.type == "invalid_request_error"
    return info.value


@pytest.fixture(scope="module")
def tok(default_model_dir) -> Tokenization:
    return Tokenization(default_model_dir)


@pytest.fixture(scope="module")
def hf_tok(default_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(default_model_dir)
