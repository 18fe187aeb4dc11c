"""Tokenization (the tokenizer worker's pure part): chat templates rendered like
transformers' apply_chat_template, completion prompts encoded like the HF tokenizer, every
bad request rejected with a 400 naming the parameter, and no torch in the process."""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from common.messages import GenerateRequest, TokenizeRequest, decode, encode, pack_ids, unpack_ids
from common.sampling_params import SamplingParams
from tokenizer_worker.chat_template import ChatTemplate
from tokenizer_worker.worker import Rejected, Tokenization

pytestmark = pytest.mark.timeout(120)

REPO = Path(__file__).resolve().parents[2]

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

# Exercises what transformers' chat environment provides beyond plain Jinja: trim_blocks
# and lstrip_blocks (block tags on their own indented lines), loop controls, `tojson`
# (non-ASCII kept, dict key order kept, indent), raise_exception, and the special-token
# strings of tokenizer_config.json as variables.
CUSTOM_TEMPLATE = """{{ bos_token }}
{% for message in messages %}
    {% if message['role'] not in ['system', 'user', 'assistant'] %}
        {{ raise_exception('Conversation roles must be system/user/assistant, got ' + message['role']) }}
    {% endif %}
    {% if message['content'] == '<END>' %}
        {% break %}
    {% endif %}
    {% if message['content'] == '<SKIP>' %}
        {% continue %}
    {% endif %}
<|im_start|>{{ message['role'] }}
{{ message['content'] }}
{{ {'i': loop.index, 'role': message['role'], 'text': message['content']} | tojson }}
{{ [message['content'], loop.last] | tojson(indent=2) }}<|im_end|>
{% endfor %}
{{ messages | length | tojson }}
{% if add_generation_prompt %}
<|im_start|>assistant
{% endif %}
{{ eos_token }}"""

CUSTOM_CONVERSATIONS = {
    "plain": CONVERSATIONS["system+user"],
    "unicode": CONVERSATIONS["unicode"],
    "break": [
        {"role": "user", "content": "one"},
        {"role": "assistant", "content": "<END>"},
        {"role": "user", "content": "never rendered"},
    ],
    "continue": [{"role": "user", "content": "<SKIP>"}, {"role": "user", "content": "two"}],
}


def hf_chat_ids(hf_tok, messages: list[dict]) -> list[int]:
    out = hf_tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    if not isinstance(out, list):  # transformers 5: a BatchEncoding
        out = out["input_ids"]
    return list(out)


def chat(messages, params=None, rid="chat-1") -> TokenizeRequest:
    return TokenizeRequest(rid, "chat", None, None, messages, params or {}, time.time(), False)


def completion(prompt=None, ids=None, params=None, rid="cmpl-1") -> TokenizeRequest:
    packed = pack_ids(ids) if isinstance(ids, list) else ids
    return TokenizeRequest(
        rid, "completion", prompt, packed, None, params or {}, time.time(), False
    )


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


def _copy_tokenizer_dir(
    src: Path, dst: Path, template: str | None, *, as_jinja: bool = False, **special: str
) -> Path:
    """A model dir with src's tokenizer and config, and `template` as its only chat template
    (in tokenizer_config.json, or in chat_template.jinja with as_jinja)."""
    dst.mkdir()
    for name in ("tokenizer.json", "config.json"):
        shutil.copy(src / name, dst / name)
    cfg = json.loads((src / "tokenizer_config.json").read_text())
    cfg.pop("chat_template", None)
    cfg.update(special)
    if template is not None and as_jinja:
        (dst / "chat_template.jinja").write_text(template)
    elif template is not None:
        cfg["chat_template"] = template
    (dst / "tokenizer_config.json").write_text(json.dumps(cfg))
    return dst


@pytest.fixture(scope="module")
def custom_dirs(default_model_dir, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("custom_template")
    special = {"bos_token": "<|endoftext|>", "eos_token": "<|im_end|>"}
    return {
        "config": _copy_tokenizer_dir(
            default_model_dir, root / "config", CUSTOM_TEMPLATE, **special
        ),
        "jinja": _copy_tokenizer_dir(
            default_model_dir, root / "jinja", CUSTOM_TEMPLATE, as_jinja=True, **special
        ),
    }


# -- chat templates ---------------------------------------------------------------------


@pytest.mark.parametrize("name", list(CONVERSATIONS))
def test_chat_ids_equal_transformers(tok, hf_tok, name):
    messages = CONVERSATIONS[name]
    out = tok(chat(messages))
    ids = unpack_ids(out.prompt_token_ids)
    assert ids == hf_chat_ids(hf_tok, messages)
    # and the rendering is the template's, verbatim: special tokens are not re-added
    text = tok.chat_template.render(messages, add_generation_prompt=True)
    assert tok.tokenizer.decode(ids, skip_special_tokens=False) == text
    assert text.endswith("<|im_start|>assistant\n")


@pytest.mark.parametrize("where", ["config", "jinja"])
@pytest.mark.parametrize("name", list(CUSTOM_CONVERSATIONS))
def test_custom_template_equals_transformers(custom_dirs, where, name):
    from transformers import AutoTokenizer

    model_dir = custom_dirs[where]
    messages = CUSTOM_CONVERSATIONS[name]
    hf = AutoTokenizer.from_pretrained(model_dir)
    tok = Tokenization(model_dir)
    ids = unpack_ids(tok(chat(messages)).prompt_token_ids)
    assert ids == hf_chat_ids(hf, messages)
    text = tok.chat_template.render(messages, add_generation_prompt=True)
    assert text.startswith("<|endoftext|>\n<|im_start|>")  # bos_token from the config
    assert text.endswith("<|im_start|>assistant\n<|im_end|>")
    if name == "break":
        assert "never rendered" not in text and "one" in text
    if name == "continue":
        assert "<SKIP>" not in text and "two" in text
    if name == "unicode":
        assert '"text": "你好，世界！今天天气怎么样？"' in text  # tojson keeps non-ASCII


def test_custom_template_raise_exception_is_400(custom_dirs):
    from transformers import AutoTokenizer

    messages = [{"role": "user", "content": "hi"}, {"role": "tool", "content": "42"}]
    hf = AutoTokenizer.from_pretrained(custom_dirs["config"])
    with pytest.raises(Exception, match="roles must be system/user/assistant"):
        hf.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    e = rejected(Tokenization(custom_dirs["config"]), chat(messages))
    assert e.param == "messages"
    assert "roles must be system/user/assistant, got tool" in e.message


def test_template_runtime_error_is_400(default_model_dir, tmp_path):
    """A template that fails on these messages (not via raise_exception) is a 400 too."""
    d = _copy_tokenizer_dir(default_model_dir, tmp_path / "m", "{{ messages[0]['content'] + 1 }}")
    e = rejected(Tokenization(d), chat([{"role": "user", "content": "x"}]))
    assert e.param == "messages"


def test_named_templates_use_default(default_model_dir, tmp_path):
    d = _copy_tokenizer_dir(default_model_dir, tmp_path / "m", None)
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    cfg["chat_template"] = [
        {"name": "tool_use", "template": "TOOLS"},
        {"name": "default", "template": "DEFAULT {{ messages | length }}"},
    ]
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    assert ChatTemplate.from_model_dir(d).render([{"role": "user", "content": "x"}]) == "DEFAULT 1"


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
    assert out.params["max_tokens"] == 6


@pytest.mark.parametrize("default, expected", [(None, 6), (4, 4), (16, 6)])
def test_unset_max_tokens_gets_the_default_capped_by_the_context(default_model_dir, default,
                                                                 expected):  # fmt: skip
    """max_tokens None: the frontend's default (None: the rest of the context), never more
    than the room the prompt leaves; a client that set none never gets a length error."""
    tok = Tokenization(default_model_dir, max_model_len=16)
    req = completion(ids=list(range(10, 20)), params={"max_tokens": None, "min_tokens": 2})
    out = tok(dataclasses.replace(req, max_tokens_default=default))
    assert out.params["max_tokens"] == expected
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
        ({"logprobs": 21}, "logprobs"),
        ({"seed": 2**64}, "seed"),
        ({"min_tokens": 5, "max_tokens": 2}, "min_tokens"),
        ({"skip_special_tokens": "yes"}, "skip_special_tokens"),
        ({"ignore_eos": 1}, "ignore_eos"),
        ({"include_stop_str_in_output": None}, "include_stop_str_in_output"),
        ({"bogus_knob": 1}, "bogus_knob"),
        ({"zzz": 1, "aaa": 2}, "aaa"),
    ],
)
def test_bad_params_are_400_naming_the_param(tok, params, param):
    for req in (completion("Hi", params=params), chat(CONVERSATIONS["user-only"], params)):
        e = rejected(tok, req)
        assert e.param == param, e.message
        assert param in e.message


def test_params_are_checked_before_the_prompt(tok):
    assert rejected(tok, completion("", params={"top_p": 0})).param == "top_p"


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
    assert unpack_ids(tok(completion("Hi")).prompt_token_ids)  # completions still work


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
    req = TokenizeRequest("r", kind, "Hi", None, None, {}, time.time(), False)
    assert rejected(tok, req).message.startswith("unknown request kind")


# -- the GenerateRequest ------------------------------------------------------------------


def test_generate_request_fields(tok):
    arrival = time.time()
    params = {"max_tokens": 7, "temperature": 0.5, "top_p": 0.9, "stop": ["\n"], "seed": 3}
    req = TokenizeRequest("rid-42", "completion", "Hello there", None, None, params, arrival, True)
    out = tok(req)
    assert isinstance(out, GenerateRequest)
    assert out.rid == "rid-42"
    assert out.arrival_time == arrival and out.tokenized_time >= arrival
    assert out.return_timings is True
    ids = unpack_ids(out.prompt_token_ids)
    assert ids == tok.tokenizer.encode("Hello there").ids
    assert pack_ids(ids) == out.prompt_token_ids
    # every sampling parameter, defaults filled in, validated and accepted by the scheduler
    expected = SamplingParams(**params).to_dict()
    assert out.params == expected
    assert SamplingParams.from_dict(out.params).validate(tok.vocab_size).to_dict() == expected
    # and it survives the wire unchanged
    assert decode(encode(out)) == out


def test_generate_request_from_chat(tok, hf_tok):
    messages = CONVERSATIONS["multi-turn"]
    arrival = time.time()
    out = tok(TokenizeRequest("c-1", "chat", None, None, messages, {}, arrival, False))
    assert out.rid == "c-1" and out.return_timings is False
    assert out.tokenized_time >= out.arrival_time == arrival
    ids = unpack_ids(out.prompt_token_ids)
    assert ids == hf_chat_ids(hf_tok, messages)
    # no max_tokens: the rest of the context
    assert out.params == {**SamplingParams().to_dict(), "max_tokens": tok.max_model_len - len(ids)}


# -- no torch ---------------------------------------------------------------------------

NO_TORCH = """
import sys, time
import tokenizer_worker.worker as tw
import detok_worker.worker
from common.messages import TokenizeRequest, unpack_ids
tok = tw.Tokenization(sys.argv[1])
out = tok(TokenizeRequest("r", "chat", None, None, [{"role": "user", "content": "hi"}], {},
                          time.time(), False))
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
