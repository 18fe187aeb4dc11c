"""Write a llama-architecture GGUF file from a random-weight model of make_models.py, as
llama.cpp's convert_hf_to_gguf lays one out (Q and K rows permuted, the tokenizer and chat
template in the file), its linears and embedding in Q8_0: the GPU check serves it to see a
GGUF file dequantized onto the device, as the default model is, on a machine with no hub.

    python make_gguf.py /tmp/m135 /tmp/m135-q8_0.gguf
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import gguf
import numpy as np
from safetensors.torch import load_file

NAMES = {
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
}


def permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's converter's permutation of a llama model's Q and K rows."""
    return (
        w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def tokenizer_fields(w: gguf.GGUFWriter, model_dir: Path) -> None:
    tok = json.loads((model_dir / "tokenizer.json").read_text())
    vocab = dict(tok["model"]["vocab"])
    special = set()
    for a in tok.get("added_tokens", []):
        vocab[a["content"]] = a["id"]
        if a.get("special"):
            special.add(a["id"])
    tokens = [""] * (max(vocab.values()) + 1)
    for text, i in vocab.items():
        tokens[i] = text
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_types([3 if i in special else 1 for i in range(len(tokens))])
    w.add_token_merges(merges)
    cfg = json.loads((model_dir / "config.json").read_text())
    w.add_bos_token_id(cfg.get("bos_token_id", 1))
    w.add_eos_token_id(cfg.get("eos_token_id", 2))
    template = model_dir / "chat_template.jinja"
    if template.is_file():
        w.add_chat_template(template.read_text())


def main() -> None:
    model_dir, out = Path(sys.argv[1]), Path(sys.argv[2])
    t0 = time.time()
    cfg = json.loads((model_dir / "config.json").read_text())
    n_head, n_kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // n_head
    w = gguf.GGUFWriter(str(out), "llama")
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(n_head)
    w.add_head_count_kv(n_kv)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_dimension_count(head_dim)
    rope = cfg.get("rope_parameters") or {}
    w.add_rope_freq_base(float(rope.get("rope_theta", cfg.get("rope_theta", 10000.0))))
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_vocab_size(cfg["vocab_size"])
    tokenizer_fields(w, model_dir)
    q8 = gguf.GGMLQuantizationType.Q8_0
    for name, t in load_file(str(model_dir / "model.safetensors")).items():
        a = t.float().numpy()
        if name == "lm_head.weight":
            if cfg.get("tie_word_embeddings"):
                continue
            gname = "output.weight"
        elif name == "model.embed_tokens.weight":
            gname = "token_embd.weight"
        elif name == "model.norm.weight":
            gname = "output_norm.weight"
        else:
            parts = name.split(".")  # model.layers.N.<module>[.<proj>].weight
            module = ".".join(parts[3:-1])
            gname = f"blk.{parts[2]}.{NAMES[module]}.{parts[-1]}"
            if module == "self_attn.q_proj":
                a = permute(a, n_head)
            elif module == "self_attn.k_proj":
                a = permute(a, n_kv)
        if a.ndim == 2:
            w.add_tensor(gname, gguf.quants.quantize(a, q8), raw_dtype=q8)
        else:
            w.add_tensor(gname, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(
        json.dumps(
            {"gguf": str(out), "bytes": out.stat().st_size, "seconds": round(time.time() - t0, 1)}
        )
    )


if __name__ == "__main__":
    main()
