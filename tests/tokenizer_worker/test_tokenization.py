"""Tokenization (the tokenizer worker's pure part): completion prompts encoded like the
HF tokenizer, every bad request rejected with a 400 naming the parameter, the
GenerateRequest it produces, and no torch in the process. Chat templates:
test_chat_template.py."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from common.messages import GenerateRequest, TokenizeRequest, decode, encode, pack_ids, unpack_ids
from common.sampling_params import InvalidParameterError, SamplingParams
from tests.tokenizer_worker.conftest import CONVERSATIONS, chat, completion, hf_chat_ids, rejected
from tokenizer_worker.tokenization import Rejected, Tokenization

pytestmark = pytest.mark.timeout(120)

REPO = Path(__file__).resolve().parents[2]

# -- completion prompts -------------------------------------------------------------------

PROMPTS = [
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.\n\nIt's 3:14 pm.",
    "你好，世界。🎉 café naïve",
    " leading space and trailing space ",
    "<|im_start|>user\nspecial tokens in text<|im_end|>",
]


@pytest.mark.parametrize("prompt", PROMPTS)
def test_completion_ids_equal_tokenizer(tok, hf_tok, default_model_dir, prompt):
    ids = unpack_ids(tok(completion(prompt)).prompt_token_ids)
    raw = Tokenizer.from_file(str(default_model_dir / "tokenizer.json"))
    assert ids == raw.encode(prompt).ids
    assert ids == list(hf_tok(prompt)["input_ids"])


def test_completion_token_ids_pass_through(tok):
    ids = [1, 2, 3, 49151, 0, 17]
    assert unpack_ids(tok(completion(ids=ids)).prompt_token_ids) == ids


# -- validation ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "req",
    [
        completion(""),
        completion(None),
        completion(ids=[]),
    ],
    ids=["empty-text", "no-prompt", "empty-ids"],
)
def test_empty_prompt_is_400(tok, req):
    e = rejected(tok, req)
    assert e.param == "prompt" and "empty" in e.message


@pytest.mark.parametrize(
    "ids, what",
    [
        ([5, 49152], "49152"),  # == vocab size
        ([2**31 - 1], str(2**31 - 1)),
        (b"\x01\x00\x00", "multiple of 4"),  # not packed ids
        (b"\xff\xff\xff\xff", "negative"),  # -1 as int32
    ],
    ids=["vocab", "int32-max", "truncated", "negative"],
)
def test_bad_token_ids_are_400(tok, ids, what):
    e = rejected(tok, completion(ids=ids))
    assert e.param == "prompt" and what in e.message


def test_prompt_too_long_names_both_lengths(default_model_dir):
    tok = Tokenization(default_model_dir, max_model_len=16)
    assert tok.max_model_len == 16
    ids = list(range(10, 30))  # 20 tokens
    e = rejected(tok, completion(ids=ids, params={"max_tokens": 1}))
    assert e.param == "prompt" and "20" in e.message and "16" in e.message
    e = rejected(tok, completion(ids=list(range(10, 26)), params={"max_tokens": 1}))  # == limit
    assert e.param == "prompt" and "16 tokens" in e.message
    text = " ".join(["one two three four five six seven eight nine ten"] * 2)
    n = len(tok.tokenizer.encode(text).ids)
    assert n >= 16
    e = rejected(tok, completion(text))
    assert e.param == "prompt" and str(n) in e.message and "16" in e.message
    long_chat = [{"role": "user", "content": text}]
    assert rejected(tok, chat(long_chat)).param == "messages"


def test_max_model_len_never_raises_the_model_limit(default_model_dir):
    hf_limit = json.loads((default_model_dir / "config.json").read_text())[
        "max_position_embeddings"
    ]
    assert Tokenization(default_model_dir).max_model_len == hf_limit
    assert Tokenization(default_model_dir, max_model_len=10 * hf_limit).max_model_len == hf_limit


def test_prompt_plus_max_tokens_over_context(default_model_dir):
    tok = Tokenization(default_model_dir, max_model_len=16)
    ids = list(range(10, 20))  # 10 tokens
    e = rejected(tok, completion(ids=ids, params={"max_tokens": 10}))
    assert e.param == "max_tokens"
    assert "16" in e.message and "20" in e.message and "10" in e.message
    assert "at most 6" in e.message
    out = tok(completion(ids=ids, params={"max_tokens": 6}))  # exactly fits
    assert out.params.max_tokens == 6


@pytest.mark.parametrize("default, expected", [(None, 6), (4, 4), (16, 6)])
def test_unset_max_tokens_gets_the_default_capped_by_the_context(
    default_model_dir, default, expected
):
    """max_tokens unset: the endpoint's cap the frontend sent (None: the context), never
    more than the room the prompt leaves; a client that set none never gets a length
    error. Settled here, once: the request the frontend sent is left as it was."""
    tok = Tokenization(default_model_dir, max_model_len=16)
    req = completion(ids=list(range(10, 20)), params={"max_tokens_cap": default, "min_tokens": 2})
    out = tok(req)
    assert out.params.max_tokens == expected and out.params.max_tokens_cap is None
    assert req.params.max_tokens is None and req.params.max_tokens_cap == default
    e = rejected(tok, completion(ids=list(range(10, 20)), params={"min_tokens": 7}))
    assert e.param == "min_tokens" and "6 tokens" in e.message
    full = list(range(10, 26))  # the whole context: no room at all
    assert "prompt is too long" in rejected(tok, completion(ids=full)).message


@pytest.mark.parametrize(
    "params, param",
    [
        ({"temperature": -1}, "temperature"),
        ({"temperature": "hot"}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": "3"}, "max_tokens"),
        ({"max_tokens": -1}, "max_tokens"),
        ({"top_k": -2}, "top_k"),
        ({"stop": "abc"}, "stop"),
        ({"stop": [""]}, "stop"),
        ({"stop_token_ids": [49152]}, "stop_token_ids"),
        ({"logit_bias": {"49152": -100}}, "logit_bias"),  # past SmolLM2's vocabulary
        ({"logit_bias": {"5": 101}}, "logit_bias"),
        ({"logprobs": 21}, "logprobs"),
        ({"seed": 2**64}, "seed"),
        ({"min_tokens": 5, "max_tokens": 2}, "min_tokens"),
        ({"skip_special_tokens": "yes"}, "skip_special_tokens"),
        ({"ignore_eos": 1}, "ignore_eos"),
        ({"include_stop_str_in_output": None}, "include_stop_str_in_output"),
    ],
)
def test_bad_params_are_400_naming_the_param(tok, params, param):
    for req in (completion("Hi", params=params), chat(CONVERSATIONS["user-only"], params)):
        e = rejected(tok, req)
        assert e.param == param, e.message
        assert param in e.message


@pytest.mark.parametrize(
    "params, param",
    [
        ({"logit_bias": {"x": 1}}, "logit_bias"),
        ({"bogus_knob": 1}, "bogus_knob"),
        ({"zzz": 1, "aaa": 2}, "aaa"),
    ],
)
def test_params_the_struct_cannot_hold_are_refused_where_it_is_built(params, param):
    """Unknown names and non-id logit_bias keys never reach a tokenizer worker: the
    struct has no place for them (SamplingParams.from_dict, the frontend's intake)."""
    with pytest.raises(InvalidParameterError) as e:
        completion("Hi", params=params)
    assert e.value.param == param and param in str(e.value)


def test_params_are_checked_before_the_prompt(tok):
    assert rejected(tok, completion("", params={"top_p": 0})).param == "top_p"


def test_params_checked_at_intake_are_not_checked_again(tok):
    """A signed request (checked: the frontend validated it) skips the parameter checks,
    not the prompt's limits; an unsigned one is checked here."""
    params = {"max_tokens": 3, "top_p": 0}  # out of range: intake would have refused it
    assert tok(completion("Hi", params=params), checked=True).params.top_p == 0
    assert rejected(tok, completion("Hi", params=params)).param == "top_p"
    too_long = {"max_tokens": 10**6}
    with pytest.raises(Rejected) as info:
        tok(completion("Hi", params=too_long), checked=True)
    assert info.value.param == "max_tokens"


def test_logit_bias_ids_are_checked_against_the_vocabulary_even_when_signed(tok):
    """The vocabulary is the tokenizer worker's fact: a signed request's logit_bias ids
    meet it here, with the prompt; the GenerateRequest carries the map on."""
    with pytest.raises(Rejected) as info:
        tok(completion("Hi", params={"logit_bias": {"3": 1, "49152": -100}}), checked=True)
    assert info.value.param == "logit_bias" and "49152" in info.value.message
    out = tok(completion("Hi", params={"logit_bias": {"49151": -100, "0": 2.5}}), checked=True)
    assert out.params.logit_bias == {49151: -100, 0: 2.5}
    assert decode(encode(out)).params.logit_bias == {49151: -100.0, 0: 2.5}


def test_chat_without_template_is_400(tiny_model_dirs, default_model_dir, tmp_path):
    """The tiny GPT-2 has no chat template (and GPT-2's n_positions as its context)."""
    d = tmp_path / "gpt2"
    d.mkdir()
    shutil.copy(tiny_model_dirs["gpt2"] / "config.json", d / "config.json")
    shutil.copy(default_model_dir / "tokenizer.json", d / "tokenizer.json")
    tok = Tokenization(d)
    assert tok.chat_template is None and tok.max_model_len == 512
    e = rejected(tok, chat(CONVERSATIONS["user-only"]))
    assert e.param == "messages" and "chat template" in e.message
    assert unpack_ids(tok(completion(ids=[1, 2, 3])).prompt_token_ids)  # completions work
    # this mixed directory's tokenizer makes ids past its model's 512: refused here, once
    assert "outside the vocabulary (size 512)" in rejected(tok, completion("Hi")).message


@pytest.mark.parametrize(
    "messages, param",
    [
        (None, "messages"),
        ([], "messages"),
        ("hello", "messages"),
        ({"role": "user", "content": "hi"}, "messages"),
        (["hello"], "messages.0"),
        ([{"role": "user", "content": "hi"}, {"role": "user"}], "messages.1"),
        ([{"content": "hi"}], "messages.0"),
        ([{"role": "user", "content": None}], "messages.0"),
        ([{"role": "user", "content": [{"type": "text", "text": "hi"}]}], "messages.0"),
        ([{"role": 1, "content": "hi"}], "messages.0"),
        ([{"role": "user", "content": "x"}] * 4097, "messages"),
    ],
)
def test_malformed_messages_are_400(tok, messages, param):
    e = rejected(tok, chat(messages))
    assert e.param == param, e.message


@pytest.mark.parametrize("kind", ["", "embedding", "Chat", "completions"])
def test_unknown_kind_is_400(tok, kind):
    req = TokenizeRequest("r", kind, "Hi", None, None, SamplingParams())
    assert rejected(tok, req).message.startswith("unknown request kind")


# -- the GenerateRequest ------------------------------------------------------------------


def test_generate_request_fields(tok):
    arrival = time.time()
    params = {"max_tokens": 7, "temperature": 0.5, "top_p": 0.9, "stop": ["\n"], "seed": 3}
    sent = SamplingParams(**params)
    req = TokenizeRequest("rid-42", "completion", "Hello there", None, None, sent, 7)
    out = tok(req)
    assert isinstance(out, GenerateRequest)
    assert out.rid == "rid-42"
    assert out.tokenized_time >= arrival
    assert out.origin == 7  # the frontend's pid, passed through
    ids = unpack_ids(out.prompt_token_ids)
    assert ids == tok.tokenizer.encode("Hello there").ids
    assert pack_ids(ids) == out.prompt_token_ids
    # every sampling parameter, as the frontend sent it, and valid for the scheduler
    assert out.params == SamplingParams(**params)
    assert out.params.validate(tok.vocab_size) == SamplingParams(**params)
    # and it survives the wire unchanged
    assert decode(encode(out)) == out


def test_generate_request_from_chat(tok, hf_tok):
    messages = CONVERSATIONS["multi-turn"]
    arrival = time.time()
    out = tok(chat(messages, rid="c-1"))
    assert out.rid == "c-1"
    assert out.tokenized_time >= arrival
    ids = unpack_ids(out.prompt_token_ids)
    assert ids == hf_chat_ids(hf_tok, messages)
    # no max_tokens: the rest of the context
    assert out.params == SamplingParams(max_tokens=tok.max_model_len - len(ids))


# -- no torch ---------------------------------------------------------------------------

NO_TORCH = """
import sys, time
import tokenizer_worker.worker as tw
import detok_worker.worker
from common.messages import TokenizeRequest, unpack_ids
from common.sampling_params import SamplingParams
tok = tw.Tokenization(sys.argv[1])
msgs = [{"role": "user", "content": "hi"}]
out = tok(TokenizeRequest("r", "chat", None, None, msgs, SamplingParams(max_tokens=None)))
assert unpack_ids(out.prompt_token_ids)
bad = sorted(m for m in ("torch", "transformers") if m in sys.modules)
assert not bad, f"imported {bad}"
print("ok")
"""


def test_workers_do_not_import_torch(default_model_dir):
    r = subprocess.run(
        [sys.executable, "-c", NO_TORCH, str(default_model_dir)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-3000:]
