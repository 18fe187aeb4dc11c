"""GGUF metadata -> Hugging Face configs, family by family: config.json and
generation_config.json, and what llama.cpp fixes in code rather than in the file.

    GGUFReader ──hf_config──────────▶ config.json (sizes, norms, rope: default, linear,
                                       yarn, or llama3 recovered from rope_freqs by
                                       llama3_rope_parameters; Gemma 3's layer types,
                                       attention scale, softcapping and local rope)
               ──generation_config──▶ generation_config.json (bos, eos, pad; Gemma's
                                       <end_of_turn> a stop token beside <eos>)

GEMMA_CHAT_TEMPLATE is Gemma's turn format, for gemma3 files published without a chat
template. The conversion (common.model_files.gguf_convert) reads the tensors and writes
the directory; this module only maps metadata, read with `read_field`. Torch-free (numpy).
"""

from __future__ import annotations

import math

import numpy as np

from common.model_files.gguf_names import GGUF_ARCHS
from common.model_files.model_source import ModelSourceError

LLAMA3_ORIGINAL_CONTEXT = 8192  # llama.cpp stores llama3 rope as factors, not its parameters


def read_field(reader, key: str, default=None):
    """A GGUFReader's metadata value for `key`, or `default` when it is absent or odd."""
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
    hf_arch, model_type, _ = GGUF_ARCHS[arch]
    window = read_field(reader, p + "attention.sliding_window")
    config = {
        "architectures": [hf_arch],
        "model_type": model_type,
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
        "attention_bias": arch == "qwen2",
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
    if arch == "gemma3":
        config.update(_gemma3_config(reader, config, rope))
    return config


def _gemma3_config(reader, config: dict, rope: dict) -> dict:
    """What llama.cpp's gemma3 graph fixes in code rather than in the file: every 6th
    layer global, the rest sliding; local RoPE base 10k unscaled (the file's rope is the
    global layers'); attention scale 1/sqrt(head_dim), or 1/sqrt(hidden / heads) for the
    27B (62 layers); GELU-tanh."""
    n_layers, n_head = config["num_hidden_layers"], config["num_attention_heads"]
    scalar = config["head_dim"] if n_layers != 62 else config["hidden_size"] // n_head
    softcap = read_field(reader, "gemma3.final_logit_softcapping")
    types = ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(n_layers)]
    return {
        "hidden_act": "gelu_pytorch_tanh",
        "hidden_activation": "gelu_pytorch_tanh",
        "layer_types": types if config.get("sliding_window") else ["full_attention"] * n_layers,
        "query_pre_attn_scalar": scalar,
        "final_logit_softcapping": _f32(softcap) if softcap else None,
        "attn_logit_softcapping": None,
        "rope_parameters": {
            "full_attention": rope,
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        },
        "rope_local_base_freq": 10000.0,
    }


# Gemma's turn format (the chat format of every Gemma 3 checkpoint, base ones included),
# for gemma3 files published without a tokenizer.chat_template: a system message opens
# the first user turn, the assistant is "model".
GEMMA_CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{%- if messages[0]['role'] == 'system' -%}"
    "{%- set first = messages[0]['content'] | trim + '\n\n' -%}{%- set turns = messages[1:] -%}"
    "{%- else -%}{%- set first = '' -%}{%- set turns = messages -%}{%- endif -%}"
    "{%- for m in turns -%}"
    "{{ '<start_of_turn>' + ('model' if m['role'] == 'assistant' else m['role']) + '\n' "
    "+ (first if loop.first else '') + m['content'] | trim + '<end_of_turn>\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\n' }}{%- endif -%}"
)
GEMMA_END_OF_TURN = "<end_of_turn>"


def _end_of_turn_id(reader, arch: str) -> int | None:
    """Gemma ends a chat turn with <end_of_turn>, a stop token beside <eos>."""
    if arch != "gemma3":
        return None
    tokens = read_field(reader, "tokenizer.ggml.tokens") or []
    return tokens.index(GEMMA_END_OF_TURN) if GEMMA_END_OF_TURN in tokens else None


def generation_config(reader, arch: str, config: dict) -> dict:
    """generation_config.json: config.json's special tokens; Gemma's <end_of_turn> stops a
    turn beside <eos>."""
    gen = {
        k: config[k]
        for k in ("bos_token_id", "eos_token_id", "pad_token_id")
        if config.get(k) is not None
    }
    end_of_turn = _end_of_turn_id(reader, arch)
    if end_of_turn is not None and "eos_token_id" in gen:
        gen["eos_token_id"] = [gen["eos_token_id"], end_of_turn]
    return gen
