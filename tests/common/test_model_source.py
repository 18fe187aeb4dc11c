"""Model sources: the embedded default (GGUF, converted once), GGUF paths, HF dirs, errors.

The real SmolLM2 GGUF is converted once per module into a temp cache. Tiny GGUF files are
written with gguf.GGUFWriter from tiny random transformers models (Q/K permuted the way
llama.cpp does it for llama), so conversion is checked tensor for tensor and logit for logit.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

from common.model_files.gguf_config import llama3_rope_parameters
from common.model_files.gguf_convert import gguf_matrices
from common.model_files.gguf_names import SUPPORTED_GGUF_ARCHS
from common.model_files.model_source import (
    COMPLETE_MARKER,
    ModelSourceError,
    cache_dir_for,
    check_weight_source,
    default_gguf_path,
    hf_reference_dir,
    resolve_model,
)
from tests.conftest import randomize_qkv_bias, tiny_config
from tests.gguf_files import llamacpp_rope_factors, write_llama_gguf

REPO_ROOT = Path(__file__).resolve().parents[2]
HF_FILES = (
    "config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "generation_config.json",
    COMPLETE_MARKER,
)


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("zs_cache")


@pytest.fixture(scope="module")
def converted(cache) -> Path:
    return resolve_model("smollm2", cache_dir=cache, progress=False)


def test_alias_converts_once_and_is_cached(converted, cache):
    assert converted.parent == cache and converted.name.startswith("SmolLM2-135M-Instruct.Q4_1-")
    for name in HF_FILES:
        assert (converted / name).is_file(), name
    config = json.loads((converted / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert (config["num_attention_heads"], config["num_key_value_heads"]) == (9, 3)
    assert config["tie_word_embeddings"] is True and config["max_position_embeddings"] == 8192
    assert (config["bos_token_id"], config["eos_token_id"]) == (1, 2)
    assert config["rope_parameters"] == {"rope_theta": 100000.0, "rope_type": "default"}
    weights = converted / "model.safetensors"
    mtime = weights.stat().st_mtime_ns
    start = time.perf_counter()
    again = resolve_model("smollm2", cache_dir=cache)
    assert time.perf_counter() - start < 0.5
    assert again == converted and weights.stat().st_mtime_ns == mtime
    assert [p.name for p in cache.iterdir() if p.is_dir()] == [converted.name]


def test_env_cache_dir_is_used(converted, cache, monkeypatch):
    monkeypatch.setenv("ZEROSERVE_CACHE_DIR", str(cache))
    assert resolve_model("smollm2") == converted


def test_gguf_path_and_hf_dir_forms(converted, cache):
    assert resolve_model(str(default_gguf_path()), cache_dir=cache) == converted
    assert resolve_model(str(converted)) == converted
    assert resolve_model(converted) == converted


def test_cache_holds_the_small_tensors_only(converted):
    """The engine reads the matrices from the GGUF: the cache keeps norms (1-D) alone."""
    from safetensors import safe_open

    with safe_open(str(converted / "model.safetensors"), framework="np") as f:
        shapes = {k: f.get_slice(k).get_shape() for k in f.keys()}  # noqa: SIM118
    assert shapes and all(len(s) == 1 for s in shapes.values()), shapes
    assert "model.norm.weight" in shapes and len(shapes) == 1 + 2 * 30


def test_converted_model_answers_in_transformers(converted, cache):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    full = resolve_model("smollm2", cache_dir=cache, progress=False, full_weights=True)
    assert full != converted and hf_reference_dir(converted) == full

    tok = AutoTokenizer.from_pretrained(converted)
    assert (tok.bos_token, tok.eos_token, tok.eos_token_id) == ("<|im_start|>", "<|im_end|>", 2)
    assert "chat_template" in json.loads((converted / "tokenizer_config.json").read_text())
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text.endswith(
        "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
    )
    ids = tok(text, return_tensors="pt").input_ids
    assert ids[0, 0].item() == 1  # the template's <|im_start|>; the tokenizer adds no BOS
    model = AutoModelForCausalLM.from_pretrained(full, dtype=torch.float32).eval()
    with torch.no_grad():
        out = model.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=16, do_sample=False
        )
    answer = tok.decode(out[0, ids.shape[1] :], skip_special_tokens=True)
    assert "Paris" in answer, answer  # wrong Q/K un-permutation yields gibberish


def test_tokenizer_json_alone(converted):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(converted / "tokenizer.json"))
    text = "<|im_start|>user\nHello, 12 wörlds!<|im_end|>\n"
    ids = tok.encode(text).ids
    assert ids[0] == 1 and 2 in ids
    assert tok.decode(ids, skip_special_tokens=False) == text


# ---- errors -------------------------------------------------------------------------------


def test_missing_path(tmp_path):
    missing = tmp_path / "nope" / "model.gguf"
    with pytest.raises(ModelSourceError, match="not found") as e:
        resolve_model(str(missing), cache_dir=tmp_path)
    assert str(missing) in str(e.value) and "smollm2" in str(e.value)


def test_garbage_gguf(tmp_path):
    bad = tmp_path / "x.gguf"
    bad.write_bytes(b"this is not a model" * 100)
    with pytest.raises(ModelSourceError, match="not a GGUF file") as e:
        resolve_model(str(bad), cache_dir=tmp_path)
    assert str(bad) in str(e.value)


@pytest.mark.parametrize("size", [20, 1 << 20, 3 << 20])  # header, strings, tensor data
def test_truncated_gguf(tmp_path, size):
    cut = tmp_path / "cut.gguf"
    with default_gguf_path().open("rb") as f:
        cut.write_bytes(f.read(size))
    with pytest.raises(ModelSourceError, match="corrupt|truncated") as e:
        resolve_model(str(cut), cache_dir=tmp_path)
    assert str(cut) in str(e.value)
    assert not [p for p in tmp_path.iterdir() if p.is_dir()]  # nothing half-written


def test_bad_hf_dirs(tmp_path):
    d = tmp_path / "model"
    d.mkdir()
    with pytest.raises(ModelSourceError, match="no config.json") as e:
        resolve_model(str(d))
    assert str(d) in str(e.value)
    (d / "config.json").write_text("{not json")
    with pytest.raises(ModelSourceError, match="not a valid config.json"):
        resolve_model(str(d))
    (d / "config.json").write_text("{}")
    with pytest.raises(ModelSourceError, match="no tokenizer"):
        resolve_model(str(d))
    (d / "tokenizer.json").write_text("{}")
    assert resolve_model(str(d)) == d  # what the tokenizer and detokenizer need
    # the weights are the engine's: refused there (and by launch.py) unless dummy
    with pytest.raises(ModelSourceError, match="no \\*.safetensors"):
        check_weight_source("auto", d)
    check_weight_source("dummy", d)
    (d / "model.safetensors").write_bytes(b"")
    check_weight_source("auto", d)


@pytest.mark.parametrize(
    "arch,match",
    [("gpt2", "'gpt2' is not supported"), ("llama", "lacks .*llama.attention.head_count")],
)
def test_unsupported_or_incomplete_gguf(tmp_path, arch, match):
    path = tmp_path / f"tiny-{arch}.gguf"
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    _close(w)
    with pytest.raises(ModelSourceError, match=match) as e:
        resolve_model(str(path), cache_dir=tmp_path)
    assert str(path) in str(e.value)
    if arch == "gpt2":
        assert all(a in str(e.value) for a in SUPPORTED_GGUF_ARCHS)


# ---- tiny synthetic GGUF files: exact round trips ------------------------------------------


def _close(w: gguf.GGUFWriter) -> None:
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _tiny(kind: str):
    from transformers import LlamaForCausalLM, Qwen2ForCausalLM

    shape = dict(vocab_size=49152, max_position_embeddings=1024, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    if kind == "qwen2":
        model = Qwen2ForCausalLM(tiny_config("Qwen2Config", tie_word_embeddings=True, **shape))
        randomize_qkv_bias(model)
        return model.eval()
    rope = {
        "rope_type": "llama3",
        "rope_theta": 500000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    }
    config = tiny_config("LlamaConfig", tie_word_embeddings=False, rope_parameters=rope, **shape)
    return LlamaForCausalLM(config).eval()


@pytest.mark.parametrize("kind,arch", [("qwen2", "qwen2"), ("llama3", "llama")])
def test_tiny_gguf_round_trip(tmp_path, kind, arch):
    from safetensors.numpy import load_file
    from transformers import AutoModelForCausalLM

    model = _tiny(kind)
    path = write_llama_gguf(model, arch, tmp_path / f"tiny-{kind}.gguf")
    lean = resolve_model(str(path), cache_dir=tmp_path / "cache", progress=False)
    out = resolve_model(str(path), cache_dir=tmp_path / "cache", progress=False, full_weights=True)
    config = json.loads((out / "config.json").read_text())
    assert config == json.loads((lean / "config.json").read_text())
    assert config["tie_word_embeddings"] is model.config.tie_word_embeddings
    weights = load_file(str(out / "model.safetensors"))
    expected = {
        k: v.numpy()
        for k, v in model.state_dict().items()
        if not (k == "lm_head.weight" and model.config.tie_word_embeddings)
    }
    assert set(weights) == set(expected)
    small = load_file(str(lean / "model.safetensors"))
    assert set(small) == {k for k, v in expected.items() if v.ndim == 1}
    # what the engine's float path reads from the file: the matrices, un-permuted
    matrices = dict(gguf_matrices(path))
    assert set(matrices) == {k for k, v in expected.items() if v.ndim == 2}
    for name, a in matrices.items():
        np.testing.assert_array_equal(a, expected[name], err_msg=name)
    for name, a in expected.items():
        np.testing.assert_array_equal(weights[name], a, err_msg=name)
    if kind == "llama3":
        assert config["rope_parameters"] == model.config.rope_parameters
    loaded = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    ids = torch.tensor([[1, 520, 9531, 198, 4093, 314, 260, 3575, 282, 4649, 47, 2]])
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).logits, model(ids).logits, rtol=0, atol=1e-5)


@pytest.mark.parametrize(
    "rope",
    [
        dict(
            factor=8.0,
            low_freq_factor=1.0,
            high_freq_factor=4.0,
            original_max_position_embeddings=8192,
        ),  # Llama 3.1 / 3.2
        dict(
            factor=32.0,
            low_freq_factor=2.0,
            high_freq_factor=8.0,
            original_max_position_embeddings=8192,
        ),
    ],
)
def test_llama3_rope_parameters_recovered(rope):
    rope = {"rope_type": "llama3", "rope_theta": 500000.0, **rope}
    factors = llamacpp_rope_factors(rope, 128)
    assert llama3_rope_parameters(factors, 500000.0, 128) == rope
    with pytest.raises(ValueError, match="not a llama3"):
        llama3_rope_parameters(factors[::-1].copy(), 500000.0, 128)


@pytest.fixture
def tiny_gguf(tmp_path) -> Path:
    return write_llama_gguf(_tiny("qwen2"), "qwen2", tmp_path / "tiny.gguf")


def test_concurrent_resolves_convert_once(tmp_path, tiny_gguf):
    cache = tmp_path / "cache"
    code = (
        "import sys; from common.model_files.model_source import resolve_model; "
        "print(resolve_model(sys.argv[1], cache_dir=sys.argv[2], progress=False))"
    )
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT), ZEROSERVE_LOG_LEVEL="INFO")
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(tiny_gguf), str(cache)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]
    results = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], results
    assert len({out.strip() for out, _ in results}) == 1
    assert sum(err.count("converting ") for _, err in results) == 1
    assert (cache_dir_for(tiny_gguf, cache) / COMPLETE_MARKER).is_file()
    assert [p.name for p in cache.iterdir() if p.is_dir()] == [cache_dir_for(tiny_gguf, cache).name]


def test_half_written_cache_is_redone(tmp_path, tiny_gguf):
    cache = tmp_path / "cache"
    out = cache_dir_for(tiny_gguf, cache)
    out.mkdir(parents=True)
    (out / "config.json").write_text("{")  # no marker: an interrupted conversion
    stale = cache / f".{out.name}.crashed"
    stale.mkdir()
    assert resolve_model(str(tiny_gguf), cache_dir=cache, progress=False) == out
    assert (out / COMPLETE_MARKER).is_file() and not stale.exists()
    assert json.loads((out / "config.json").read_text())["model_type"] == "qwen2"
