"""The conversion's tokenizer class (gguf_convert._tokenizer_class) is the one AutoTokenizer
picks for the file, and the tokenizer it builds saves to the same files, without
AutoTokenizer's pass of gguf-py's GGUFReader over the whole file."""

from __future__ import annotations

import filecmp
import shutil
from pathlib import Path

import pytest

from common.model_files.gguf_convert import _tokenizer_class
from common.model_files.model_source import default_gguf_path, resolve_model
from tests.common.test_model_source import _tiny
from tests.gguf_files import write_llama_gguf


def _embedded(tmp_path: Path) -> Path:
    """The embedded model's file (a llama GGUF), alone in a directory."""
    src = default_gguf_path()
    dst = tmp_path / "embedded" / src.name
    dst.parent.mkdir()
    dst.symlink_to(src)
    return dst


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_gguf_tokenizer_is_autotokenizers(kind, tmp_path):
    from transformers import AutoTokenizer

    if kind == "llama":
        path = _embedded(tmp_path)
    else:
        (tmp_path / kind).mkdir()
        path = write_llama_gguf(_tiny(kind), kind, tmp_path / kind / "m.gguf")
    auto = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    cls = _tokenizer_class(kind, path)
    assert cls is not AutoTokenizer and cls.__name__ == type(auto).__name__
    ours = cls.from_pretrained(str(path.parent), gguf_file=path.name)
    a, b = tmp_path / "auto", tmp_path / "ours"
    auto.save_pretrained(str(a))
    ours.save_pretrained(str(b))
    names = sorted(p.name for p in a.iterdir())
    assert names == sorted(p.name for p in b.iterdir()) and "tokenizer.json" in names
    for name in names:
        assert filecmp.cmp(a / name, b / name, shallow=False), name
    text = "Hello, world! <|im_start|>user\nwhat's 2+2?"
    assert ours(text)["input_ids"] == auto(text)["input_ids"]


def test_a_directory_that_declares_its_tokenizer_or_an_unknown_architecture(tmp_path):
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    path = _embedded(tmp_path)
    assert _tokenizer_class("granite", path) is PreTrainedTokenizerFast  # not in transformers'
    shutil.copy(resolve_model("smollm2") / "tokenizer_config.json", path.parent)
    assert _tokenizer_class("llama", path) is AutoTokenizer  # it would read that file
