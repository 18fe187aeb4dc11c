"""Structured outputs at intake: a spec that compiles passes, one that does not is a 400
naming `structured`, and the same spec is compiled once (cached by its text)."""

from __future__ import annotations

import json

import pytest

from common.messages import unpack_ids
from tests.tokenizer_worker.conftest import CONVERSATIONS, chat, completion, rejected
from tokenizer_worker import grammar

pytestmark = pytest.mark.timeout(120)

GOOD = [
    {
        "kind": "json",
        "spec": json.dumps({"type": "object", "properties": {"a": {"type": "integer"}}}),
    },
    {"kind": "json", "spec": "{}", "whitespace_pattern": "[ \\n]{0,2}"},
    {"kind": "json_object", "spec": ""},
    {"kind": "regex", "spec": "[0-9]{3}"},
    {"kind": "choice", "spec": json.dumps(["a", 'b"c', "d\\e"])},
    # the tools helper's shape: a Lark grammar embedding a JSON schema
    {
        "kind": "grammar",
        "spec": 'start: "<tool_call>" call "</tool_call>"\n'
        'call: %json {"type": "object", "properties": {"name": {"const": "f"}}, '
        '"required": ["name"]}\n',
    },
]
BAD = [
    {"kind": "json", "spec": "{not json"},
    {"kind": "json", "spec": json.dumps({"type": "objectx"})},
    {"kind": "json", "spec": json.dumps({"type": "string", "pattern": "[a-"})},
    {"kind": "json", "spec": "[1, 2]"},
    {"kind": "regex", "spec": "(unclosed"},
    {"kind": "choice", "spec": "[]"},
    {"kind": "choice", "spec": "[1]"},
    {"kind": "grammar", "spec": "start: undefined_rule"},
    {"kind": "json", "spec": "{}", "whitespace_pattern": "[a-"},
]


@pytest.mark.parametrize("spec", GOOD)
def test_good_specs_pass_on_the_wire(tok, spec):
    req = chat(CONVERSATIONS["user-only"], {"max_tokens": 8, "structured": spec})
    out = tok(req)
    assert out.params.structured == spec and unpack_ids(out.prompt_token_ids)


@pytest.mark.parametrize("spec", BAD)
def test_bad_specs_are_400_naming_structured(tok, spec):
    e = rejected(tok, completion("Hi", params={"structured": spec}))
    assert e.status == 400 and e.param == "structured" and e.message.startswith("structured:")


@pytest.mark.parametrize(
    "value", [{"kind": "xml", "spec": ""}, {"kind": "json"}, "json", {"kind": "json", "spec": 1}]
)
def test_malformed_field_is_400(tok, value):
    assert rejected(tok, completion("Hi", params={"structured": value})).param == "structured"


def test_each_spec_is_compiled_once(tok, monkeypatch):
    calls = []
    real = grammar.grammar_text
    monkeypatch.setattr(grammar, "grammar_text", lambda s: calls.append(s) or real(s))
    spec = {"kind": "regex", "spec": "[a-z]{1,5}-once"}
    for _ in range(3):
        tok(completion("Hi", params={"max_tokens": 4, "structured": spec}))
    bad = {"kind": "regex", "spec": "[a-z-once"}
    for _ in range(2):
        assert rejected(tok, completion("Hi", params={"structured": bad})).param == "structured"
    assert calls == [spec, bad]


@pytest.mark.parametrize(
    "spec, ok",
    [
        ("start: <|im_end|>", True),  # SmolLM2's end-of-turn token
        ('start: "a" <[7]>', True),
        ("start: <|no_such_token|>", False),
        ("start: <[999999]>", False),  # past the vocabulary
    ],
)
def test_grammars_that_name_tokens_are_checked_against_the_tokenizer(tok, spec, ok):
    req = completion(
        "Hi", params={"max_tokens": 4, "structured": {"kind": "grammar", "spec": spec}}
    )
    if ok:
        assert tok(req).params.structured["spec"] == spec
    else:
        e = rejected(tok, req)
        assert e.status == 400 and e.param == "structured" and "token" in e.message.lower()


def test_the_tokenizer_is_built_only_for_grammars_that_name_tokens(default_model_dir, monkeypatch):
    from tokenizer_worker.tokenization import Tokenization

    built = []
    real = grammar.llg_tokenizer
    monkeypatch.setattr(grammar, "llg_tokenizer", lambda *a: built.append(a) or real(*a))
    t = Tokenization(default_model_dir)
    for spec in GOOD:
        t(completion("Hi", params={"max_tokens": 4, "structured": spec}))
    for spec in BAD:
        rejected(t, completion("Hi", params={"structured": spec}))
    assert built == []  # JSON schemas, regexes, choices, Lark without token names, 400s
    t(
        completion(
            "Hi",
            params={
                "max_tokens": 4,
                "structured": {"kind": "grammar", "spec": "start: <|im_end|>"},
            },
        )
    )
    assert len(built) == 1
