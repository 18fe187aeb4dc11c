"""GGUF tensor names -> our HF module names, per GGUF architecture: one data table that
the conversion (common.model_files.gguf_convert) and the engine's loader read.

llama-layout architectures share one layer map; an architecture adds or replaces entries
(QK-norm, Gemma's pre/post norms, Phi-3's fused qkv / gate_up).
"""

from __future__ import annotations

import re

_LAYER_NAMES = {  # GGUF layer tensor -> HF module, the llama layout every arch starts from
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
_QK_NORM_NAMES = {"attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm"}
# GGUF architecture -> (HF architectures name, model_type, layer tensor names). Every
# listed layer tensor must be in the file.
GGUF_ARCHS: dict[str, tuple[str, str, dict[str, str]]] = {
    "llama": ("LlamaForCausalLM", "llama", _LAYER_NAMES),
    "qwen2": ("Qwen2ForCausalLM", "qwen2", _LAYER_NAMES),
    "qwen3": ("Qwen3ForCausalLM", "qwen3", {**_LAYER_NAMES, **_QK_NORM_NAMES}),
    # Phi-3 keeps HF's fused projections: attn_qkv, and ffn_up holding gate then up
    "phi3": (
        "Phi3ForCausalLM",
        "phi3",
        {
            "attn_qkv": "self_attn.qkv_proj",
            "attn_output": "self_attn.o_proj",
            "ffn_up": "mlp.gate_up_proj",
            "ffn_down": "mlp.down_proj",
            "attn_norm": "input_layernorm",
            "ffn_norm": "post_attention_layernorm",
        },
    ),
    # Gemma 3: four norms per layer; llama.cpp stores Gemma's norm weights as 1 + w
    "gemma3": (
        "Gemma3ForCausalLM",
        "gemma3_text",
        {
            **_LAYER_NAMES,
            **_QK_NORM_NAMES,
            "ffn_norm": "pre_feedforward_layernorm",
            "post_attention_norm": "post_attention_layernorm",
            "post_ffw_norm": "post_feedforward_layernorm",
        },
    ),
}
SUPPORTED_GGUF_ARCHS = tuple(GGUF_ARCHS)
_NORM_PLUS_ONE_ARCHS = ("gemma3",)  # norm weights stored as 1 + w
_TOP_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}


def hf_name(name: str, arch: str = "llama") -> str | None:
    if name in _TOP_NAMES:
        return _TOP_NAMES[name]
    layer_names = GGUF_ARCHS[arch][2]
    m = re.fullmatch(r"blk\.(\d+)\.(\w+)\.(weight|bias)", name)
    if m and m.group(2) in layer_names:
        return f"model.layers.{m.group(1)}.{layer_names[m.group(2)]}.{m.group(3)}"
    return None
