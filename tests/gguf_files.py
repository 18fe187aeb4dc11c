"""Tiny GGUF files written as llama.cpp's convert_hf_to_gguf lays them out, for the tests.

The name tables here are the tests' own (llama.cpp's names), never the product's
(common/families), which these files check. The default model's tokenizer goes in every
file (a model of its 49,152-token vocabulary)."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping
from pathlib import Path

import gguf
import numpy as np

from common.model_files.model_source import default_gguf_path

# HF module -> GGUF layer tensor: the llama layout (convert_hf_to_gguf's names)
LLAMA_NAMES: Mapping[str, str] = {
    "q_proj": "attn_q",
    "k_proj": "attn_k",
    "v_proj": "attn_v",
    "o_proj": "attn_output",
    "gate_proj": "ffn_gate",
    "up_proj": "ffn_up",
    "down_proj": "ffn_down",
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
}
TOP_NAMES = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}
QType = gguf.GGMLQuantizationType | Callable[[str], gguf.GGMLQuantizationType] | None


def permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's permutation of Q and K rows (LlamaModel.permute)."""
    return (
        w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


@functools.cache
def tokenizer_fields() -> dict:
    """The default model's tokenizer.ggml tokens, token types and merges."""
    reader = gguf.GGUFReader(str(default_gguf_path()))
    return {
        k: reader.fields[f"tokenizer.ggml.{k}"].contents()
        for k in ("tokens", "token_type", "merges")
    }


def write_gguf(
    model,
    arch: str,
    path: Path,
    qtype: QType = None,
    *,
    names: Mapping[str, str] = LLAMA_NAMES,
    permute_qk: bool = False,
    extra: Callable[[gguf.GGUFWriter], None] | None = None,
) -> Path:
    """`model` (a transformers causal LM) as a GGUF file of `arch`: float32, or with every
    matrix but the embedding in `qtype` (a type, or a function of the GGUF name); Q and K
    rows permuted where llama.cpp permutes them; `extra(writer)` adds the architecture's
    own metadata (and tensors)."""
    cfg = model.config
    n_head, n_kv = cfg.num_attention_heads, cfg.num_key_value_heads
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_kv)
    w.add_rope_freq_base(cfg.rope_parameters["rope_theta"])
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    fields = tokenizer_fields()
    w.add_token_list(fields["tokens"])
    w.add_token_types(fields["token_type"])
    w.add_token_merges(fields["merges"])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    if extra is not None:
        extra(w)
    for name, t in model.state_dict().items():
        a = t.numpy().astype(np.float32)
        parts = name.split(".")
        if name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        # model.layers.N.(self_attn|mlp).proj.(weight|bias) or model.layers.N.norm.weight
        gname = TOP_NAMES.get(name) or f"blk.{parts[2]}.{names[parts[-2]]}.{parts[-1]}"
        if permute_qk and parts[-2] in ("q_proj", "k_proj"):
            a = permute(a, n_head if parts[-2] == "q_proj" else n_kv)
        q = qtype(gname) if callable(qtype) and not isinstance(qtype, int) else qtype
        if q is not None and a.ndim == 2 and gname != "token_embd.weight":
            data = IQ4_QUANTIZERS.get(q, lambda a, q=q: gguf.quants.quantize(a, q))(a)
            w.add_tensor(gname, data, raw_dtype=q)
        else:
            w.add_tensor(gname, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def llamacpp_rope_factors(rope: dict, head_dim: int) -> np.ndarray:
    """llama.cpp's rope_freqs of a llama3 rope (its formula)."""
    freqs = 1.0 / rope["rope_theta"] ** (np.arange(0, head_dim, 2) / head_dim)
    old, lo, hi, factor = (
        rope["original_max_position_embeddings"],
        rope["low_freq_factor"],
        rope["high_freq_factor"],
        rope["factor"],
    )
    out = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < old / hi:
            out.append(1.0)
        elif wavelen > old / lo:
            out.append(factor)
        else:
            smooth = (old / wavelen - lo) / (hi - lo)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def write_llama_gguf(model, arch: str, path: Path, qtype: QType = None) -> Path:
    """A llama-layout file (llama, qwen2) as convert_hf_to_gguf writes it: rope dimension
    count, a chat template, llama3 rope factors as rope_freqs, llama's Q/K permuted."""
    cfg = model.config
    head_dim = cfg.hidden_size // cfg.num_attention_heads

    def extra(w: gguf.GGUFWriter) -> None:
        w.add_rope_dimension_count(head_dim)
        w.add_chat_template(
            "{% for m in messages %}<|im_start|>{{ m['content'] }}<|im_end|>{% endfor %}"
        )
        if cfg.rope_parameters.get("rope_type") == "llama3":
            w.add_tensor("rope_freqs.weight", llamacpp_rope_factors(cfg.rope_parameters, head_dim))

    return write_gguf(model, arch, path, qtype, permute_qk=arch == "llama", extra=extra)


IQ4_NL_VALUES = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113])


def quantize_iq4_xs(a: np.ndarray) -> np.ndarray:
    """float32 [n, k] (k % 256 == 0) -> IQ4_XS rows [n, k / 256 * 136] (gguf-py has no IQ4_XS
    quantizer): per block of 32 the value of largest magnitude maps to -127, the block
    scales rounded to 6 bits of a float16 d per 256 (llama.cpp's recipe without its search),
    each value to its nearest codebook entry."""
    n, k = a.shape
    b = a.astype(np.float32).reshape(n, k // 256, 8, 32)
    at = np.abs(b).argmax(-1)[..., None]
    scale = np.take_along_axis(b, at, -1)[..., 0] / -127.0  # [n, nu, 8]
    big = np.take_along_axis(scale, np.abs(scale).argmax(-1)[..., None], -1)
    d = (big / -32.0).astype(np.float16)  # [n, nu, 1]
    df = d.astype(np.float32)
    inv = np.divide(1.0, df, out=np.zeros_like(df), where=df != 0)
    ls = np.clip(np.rint(scale * inv), -32, 31).astype(np.int32)  # ls - 32
    dl = (df * ls)[..., None, None]  # [n, nu, 8, 1, 1]
    q = np.abs(IQ4_NL_VALUES * dl - b[..., None]).argmin(-1).astype(np.uint8)  # [n, nu, 8, 32]
    u = (ls + 32).astype(np.uint16)
    out = np.zeros((n, k // 256, 136), np.uint8)
    out[..., 0:2] = d.view(np.uint8)
    out[..., 2:4] = (
        ((u >> 4) << (2 * np.arange(8, dtype=np.uint16)))
        .sum(-1, dtype=np.uint16)[..., None]
        .view(np.uint8)
    )
    low = (u & 15).astype(np.uint8).reshape(n, k // 256, 4, 2)
    out[..., 4:8] = low[..., 0] | (low[..., 1] << 4)
    out[..., 8:] = (q[..., :16] | (q[..., 16:] << 4)).reshape(n, k // 256, 128)
    return out.reshape(n, -1)


def quantize_iq4_nl(a: np.ndarray) -> np.ndarray:
    """float32 [n, k] (k % 32 == 0) -> IQ4_NL rows [n, k / 32 * 18]: per block of 32 a
    float16 d mapping the value of largest magnitude to -127, each value to its nearest
    codebook entry."""
    n, k = a.shape
    b = a.astype(np.float32).reshape(n, k // 32, 32)
    big = np.take_along_axis(b, np.abs(b).argmax(-1)[..., None], -1)
    d = (big / -127.0).astype(np.float16)  # [n, nb, 1]
    q = np.abs(IQ4_NL_VALUES * d.astype(np.float32)[..., None] - b[..., None]).argmin(-1)
    q = q.astype(np.uint8)
    out = np.zeros((n, k // 32, 18), np.uint8)
    out[..., 0:2] = d.view(np.uint8)
    out[..., 2:] = q[..., :16] | (q[..., 16:] << 4)
    return out.reshape(n, -1)


IQ4_QUANTIZERS = {  # the types gguf-py cannot quantize
    gguf.GGMLQuantizationType.IQ4_XS: quantize_iq4_xs,
    gguf.GGMLQuantizationType.IQ4_NL: quantize_iq4_nl,
}
