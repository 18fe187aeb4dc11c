"""GGUF metadata -> Hugging Face configs: config.json and generation_config.json.

    GGUF header ──hf_config─────────▶ config.json (sizes, norms, rope: default, linear,
                                       yarn, or llama3 recovered from rope_freqs by
                                       llama3_rope_parameters; then the family's own keys,
                                       GGUFSpec.config: what llama.cpp fixes in code
                                       rather than in the file, as Gemma 3's layer types)
               ──generation_config──▶ generation_config.json (bos, eos, pad; a family's
                                       stop tokens beside eos, as Gemma's <end_of_turn>)

The conversion (common.model_files.gguf_convert) reads the tensors and writes
the directory; this module only maps metadata, read with `read_field`. Torch-free (numpy).
"""

from __future__ import annotations

import math

import numpy as np

from common.families import gguf_family, gguf_spec
from common.model_files.gguf_header import GGUFHeader
from common.model_files.model_source import ModelSourceError

LLAMA3_ORIGINAL_CONTEXT = 8192  # llama.cpp stores llama3 rope as factors, not its parameters


def read_field(reader, key: str, default=None):
    """The metadata value for `key` of a GGUFHeader (gguf_header.read_header) or of a
    GGUFReader, or `default` when it is absent or odd."""
    if isinstance(reader, GGUFHeader):
        return reader.get(key, default)
    f = reader.fields.get(key)
    if f is None:
        return default
    try:
        return f.contents()
    except Exception:  # noqa: BLE001 (gguf raises several kinds on odd fields)
        return default


def llama3_rope_parameters(
    factors: np.ndarray,
    theta: float,
    head_dim: int,
    original_context: int = LLAMA3_ORIGINAL_CONTEXT,
) -> dict:
    """Recover HF's llama3 rope parameters from llama.cpp's per-frequency `rope_freqs`.

    llama.cpp writes r_i = 1 (short wavelengths), `factor` (long ones) and, between,
    1 / ((1 - s) / factor + s) with s = (ctx / wavelen - low) / (high - low): s is linear in
    ctx / wavelen, so a line through the middle points gives low (intercept) and high.
    """
    factors = np.asarray(factors, dtype=np.float64)
    factor = float(factors.max())
    inv_freq = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    x = original_context / (2 * math.pi / inv_freq)
    mid = (factors > 1 + 1e-4) & (factors < factor * (1 - 1e-4))
    low, high = 1.0, 4.0  # every published llama3 model
    if mid.sum() >= 2:
        s = (1 / factors[mid] - 1 / factor) / (1 - 1 / factor)
        slope, low = np.polyfit(s, x[mid], 1)
        low, high = round(float(low), 3), round(float(low + slope), 3)
    params = {
        "rope_type": "llama3",
        "rope_theta": theta,
        "factor": factor,
        "low_freq_factor": low,
        "high_freq_factor": high,
        "original_max_position_embeddings": original_context,
    }
    s = np.clip((x - low) / (high - low), 0.0, 1.0)
    expected = 1 / ((1 - s) / factor + s)
    if factor <= 1 or not np.allclose(expected, factors, rtol=1e-3):
        raise ValueError(f"rope_freqs is not a llama3 rope scaling (factors {factors.tolist()})")
    return params


def _f32(value: float) -> float:
    """GGUF stores float32: 9.999999747378752e-06 is written back as the 1e-05 it was."""
    return float(str(np.float32(value)))


def hf_config(
    reader, arch: str, tie: bool, vocab: int, hidden: int, rope_factors: np.ndarray | None = None
) -> dict:
    p = f"{arch}."
    n_head = int(read_field(reader, p + "attention.head_count"))
    head_dim = int(read_field(reader, p + "attention.key_length", hidden // n_head))
    theta = _f32(read_field(reader, p + "rope.freq_base", 10000.0))
    rope: dict = {"rope_theta": theta, "rope_type": "default"}
    scaling = read_field(reader, p + "rope.scaling.type", "none")
    orig_ctx = read_field(reader, p + "rope.scaling.original_context_length")
    if scaling in ("linear", "yarn"):
        rope.update(rope_type=scaling, factor=_f32(read_field(reader, p + "rope.scaling.factor")))
        if scaling == "yarn" and orig_ctx:
            rope["original_max_position_embeddings"] = int(orig_ctx)
    elif scaling != "none":
        raise ModelSourceError(
            f"GGUF rope scaling {scaling!r} is not supported "
            "(supported: none, linear, yarn, llama3 rope_freqs)"
        )
    if rope_factors is not None:
        try:
            rope = llama3_rope_parameters(
                rope_factors, theta, head_dim, int(orig_ctx or LLAMA3_ORIGINAL_CONTEXT)
            )
        except ValueError as e:
            raise ModelSourceError(f"GGUF file: {e}") from e
    family = gguf_family(arch)
    spec = gguf_spec(arch)
    window = read_field(reader, p + "attention.sliding_window")
    config = {
        "architectures": [family.hf_architectures[0]],
        "model_type": spec.model_type,
        "vocab_size": vocab,
        "hidden_size": hidden,
        "intermediate_size": int(read_field(reader, p + "feed_forward_length")),
        "num_hidden_layers": int(read_field(reader, p + "block_count")),
        "num_attention_heads": n_head,
        "num_key_value_heads": int(read_field(reader, p + "attention.head_count_kv", n_head)),
        "head_dim": head_dim,
        "max_position_embeddings": int(read_field(reader, p + "context_length", 2048)),
        "rms_norm_eps": _f32(read_field(reader, p + "attention.layer_norm_rms_epsilon", 1e-6)),
        "hidden_act": "silu",
        "attention_bias": False,
        "rope_theta": theta,
        "rope_parameters": rope,
        **({"rope_scaling": rope} if rope["rope_type"] != "default" else {}),
        "tie_word_embeddings": tie,
        "bos_token_id": read_field(reader, "tokenizer.ggml.bos_token_id"),
        "eos_token_id": read_field(reader, "tokenizer.ggml.eos_token_id"),
        "pad_token_id": read_field(reader, "tokenizer.ggml.padding_token_id"),
        "torch_dtype": "float32",
        "dtype": "float32",
        **({"sliding_window": int(window)} if window else {}),
    }
    if spec.config is not None:  # the family's own keys

        def read(key: str, default):
            value = read_field(reader, key, default)
            return _f32(value) if isinstance(value, float) else value

        config.update(spec.config(read, config))
    return config


def generation_config(reader, arch: str, config: dict) -> dict:
    """generation_config.json: config.json's special tokens; a family's stop tokens (Gemma's
    <end_of_turn>) end a turn beside EOS."""
    gen = {
        k: config[k]
        for k in ("bos_token_id", "eos_token_id", "pad_token_id")
        if config.get(k) is not None
    }
    stops = gguf_spec(arch).stop_tokens
    tokens = (read_field(reader, "tokenizer.ggml.tokens") or []) if stops else []
    extra = [tokens.index(t) for t in stops if t in tokens]
    if extra and "eos_token_id" in gen:
        gen["eos_token_id"] = [gen["eos_token_id"], *extra]
    return gen
