"""GGUF → Hugging Face directory: dequantized float32 safetensors, config.json, tokenizer.

llama.cpp's converter permutes the Q and K projections of llama-architecture models
(its rope pairs adjacent dims; HF's pairs the two halves); the permutation is undone here.
Torch-free (numpy + gguf + safetensors.numpy); transformers is used for the tokenizer only.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np

SUPPORTED_GGUF_ARCHS = ("llama", "qwen2")
_HF_ARCH = {"llama": ("LlamaForCausalLM", "llama"), "qwen2": ("Qwen2ForCausalLM", "qwen2")}
_LAYER_NAMES = {
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
_TOP_NAMES = {"token_embd.weight": "model.embed_tokens.weight",
              "output_norm.weight": "model.norm.weight", "output.weight": "lm_head.weight"}


class GGUFConversionError(Exception):
    pass


def _field(reader, key: str, default=None):
    f = reader.fields.get(key)
    if f is None:
        return default
    try:
        return f.contents()
    except Exception:  # noqa: BLE001 (gguf raises several kinds on odd fields)
        return default


def _unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Inverse of llama.cpp's `permute(w, n_head)` on a [out, in] (or [out]) array."""
    rest = w.shape[1:]
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *rest).swapaxes(1, 2).reshape(w.shape)


def hf_name(name: str) -> str | None:
    if name in _TOP_NAMES:
        return _TOP_NAMES[name]
    m = re.fullmatch(r"blk\.(\d+)\.(\w+)\.(weight|bias)", name)
    if m and m.group(2) in _LAYER_NAMES:
        return f"model.layers.{m.group(1)}.{_LAYER_NAMES[m.group(2)]}.{m.group(3)}"
    return None


def convert_gguf(gguf_path: Path, out_dir: Path, progress: bool = True) -> None:
    import gguf
    from safetensors.numpy import save_file
    from tqdm import tqdm

    try:
        reader = gguf.GGUFReader(str(gguf_path))
    except Exception as e:  # noqa: BLE001 (the reader raises many kinds on corrupt files)
        raise GGUFConversionError(f"GGUF file {gguf_path} is corrupt or truncated: {e}") from e
    arch = _field(reader, "general.architecture")
    if arch not in SUPPORTED_GGUF_ARCHS:
        raise GGUFConversionError(
            f"GGUF file {gguf_path}: architecture {arch!r} is not supported; "
            f"supported: {list(SUPPORTED_GGUF_ARCHS)}"
        )
    p = f"{arch}."
    n_head = int(_field(reader, p + "attention.head_count"))
    n_kv = int(_field(reader, p + "attention.head_count_kv", n_head))
    tensors: dict[str, np.ndarray] = {}
    try:
        for t in tqdm(reader.tensors, desc=f"converting {gguf_path.name}", unit="tensor",
                      disable=not progress):
            name = hf_name(t.name)
            if name is None:
                continue  # e.g. rope_freqs: recomputed from the config
            w = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
            w = w.reshape(tuple(reversed([int(d) for d in t.shape])))
            if arch == "llama" and name.endswith(("q_proj.weight", "q_proj.bias")):
                w = _unpermute(w, n_head)
            elif arch == "llama" and name.endswith(("k_proj.weight", "k_proj.bias")):
                w = _unpermute(w, n_kv)
            tensors[name] = np.ascontiguousarray(w)
    except (ValueError, IndexError, NotImplementedError) as e:
        raise GGUFConversionError(f"GGUF file {gguf_path}: cannot dequantize: {e}") from e
    save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    config = _hf_config(reader, arch, n_head, n_kv, tie="lm_head.weight" not in tensors,
                        vocab=tensors["model.embed_tokens.weight"].shape[0],
                        hidden=tensors["model.embed_tokens.weight"].shape[1])
    (out_dir / "config.json").write_text(json.dumps(config, indent=2))
    (out_dir / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": config["bos_token_id"], "eos_token_id": config["eos_token_id"]}, indent=2))
    _write_tokenizer(gguf_path, out_dir)


def _hf_config(reader, arch: str, n_head: int, n_kv: int, tie: bool, vocab: int, hidden: int) -> dict:
    p = f"{arch}."
    theta = float(_field(reader, p + "rope.freq_base", 10000.0))
    rope: dict = {"rope_theta": theta, "rope_type": "default"}
    scaling_type = _field(reader, p + "rope.scaling.type")
    if scaling_type == "linear":
        rope.update(rope_type="linear", factor=float(_field(reader, p + "rope.scaling.factor")))
    hf_arch, model_type = _HF_ARCH[arch]
    head_dim = int(_field(reader, p + "rope.dimension_count", hidden // n_head))
    return {
        "architectures": [hf_arch],
        "model_type": model_type,
        "vocab_size": vocab,
        "hidden_size": hidden,
        "intermediate_size": int(_field(reader, p + "feed_forward_length")),
        "num_hidden_layers": int(_field(reader, p + "block_count")),
        "num_attention_heads": n_head,
        "num_key_value_heads": n_kv,
        "head_dim": head_dim,
        "max_position_embeddings": int(_field(reader, p + "context_length", 2048)),
        "rms_norm_eps": float(_field(reader, p + "attention.layer_norm_rms_epsilon", 1e-6)),
        "hidden_act": "silu",
        "rope_theta": theta,
        "rope_parameters": rope,
        "tie_word_embeddings": tie,
        "bos_token_id": _field(reader, "tokenizer.ggml.bos_token_id"),
        "eos_token_id": _field(reader, "tokenizer.ggml.eos_token_id"),
        "pad_token_id": _field(reader, "tokenizer.ggml.padding_token_id"),
        "torch_dtype": "float32",
    }


def _write_tokenizer(gguf_path: Path, out_dir: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    tok.save_pretrained(str(out_dir))
    cfg_path = out_dir / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    template = getattr(tok, "chat_template", None)
    jinja = out_dir / "chat_template.jinja"
    if template is None and jinja.exists():
        template = jinja.read_text()
    if template:
        cfg["chat_template"] = template
    cfg.pop("is_local", None)
    cfg_path.write_text(json.dumps(cfg, indent=2, ensure_ascii=False))
