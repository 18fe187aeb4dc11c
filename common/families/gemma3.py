"""Gemma 3 text: sandwich norms computing x * (1 + w), per-head QK-norm, GELU-tanh,
embeddings times sqrt(hidden), the softmax scale query_pre_attn_scalar^-0.5, local
(windowed) and global layers with their own RoPE bases, softcapped logits; llama.cpp
stores its norm weights as 1 + w and fixes in code what its files leave out
(`_gguf_config`)."""

from __future__ import annotations

from typing import Any

from common.families.base import (
    LLAMA_LAYERS,
    QK_NORM_LAYERS,
    Family,
    GGUFSpec,
    LayerRecipe,
    Read,
    decoder_args,
)

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


def _gguf_config(read: Read, config: dict) -> dict:
    """What llama.cpp's gemma3 graph fixes in code rather than in the file: every 6th
    layer global, the rest sliding; local RoPE base 10k unscaled (the file's rope is the
    global layers'); attention scale 1/sqrt(head_dim), or 1/sqrt(hidden / heads) for the
    27B (62 layers); GELU-tanh."""
    n_layers, n_head = config["num_hidden_layers"], config["num_attention_heads"]
    scalar = config["head_dim"] if n_layers != 62 else config["hidden_size"] // n_head
    softcap = read("gemma3.final_logit_softcapping", None)
    types = ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(n_layers)]
    return {
        "hidden_act": "gelu_pytorch_tanh",
        "hidden_activation": "gelu_pytorch_tanh",
        "layer_types": types if config.get("sliding_window") else ["full_attention"] * n_layers,
        "query_pre_attn_scalar": scalar,
        "final_logit_softcapping": softcap if softcap else None,
        "attn_logit_softcapping": None,
        "rope_parameters": {
            "full_attention": config["rope_parameters"],
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        },
        "rope_local_base_freq": 10000.0,
    }


def _rope(params: dict[str, Any], theta: float) -> tuple[float, dict[str, Any] | None]:
    p = dict(params)
    theta = float(p.pop("rope_theta", theta))
    return theta, None if p.get("rope_type", p.get("type", "default")) == "default" else p


def _args(hf: dict) -> dict:
    if hf.get("attn_logit_softcapping") is not None:
        raise ValueError("attention logit softcapping (Gemma 2) is not supported")
    args = decoder_args(hf)
    # transformers 5's nested `rope_parameters`, or the older rope_theta /
    # rope_local_base_freq / rope_scaling
    params = hf.get("rope_parameters") or {}
    full = params.get("full_attention") or hf.get("rope_scaling") or {}
    local = params.get("sliding_attention") or {}
    softcap = hf.get("final_logit_softcapping")
    return {
        **args,
        "embedding_scale": hf["hidden_size"] ** 0.5,
        "attention_scale": float(hf.get("query_pre_attn_scalar") or args["head_dim"]) ** -0.5,
        "logit_softcap": float(softcap) if softcap else None,
        "global_rope": _rope(full, hf.get("rope_theta", 1_000_000.0)),
        "local_rope": _rope(local, hf.get("rope_local_base_freq", 10_000.0)),
    }


GEMMA3 = Family(
    "gemma3",
    ("Gemma3ForCausalLM",),
    _args,
    recipe=LayerRecipe(norm_weight_offset=1.0, post_norm=True, qk_norm="head"),
    decode_style=("qk_norm", "sandwich", "gelu_tanh"),
    gguf=GGUFSpec(
        "gemma3",
        "gemma3_text",
        {  # four norms per layer
            **LLAMA_LAYERS,
            **QK_NORM_LAYERS,
            "ffn_norm": "pre_feedforward_layernorm",
            "post_attention_norm": "post_attention_layernorm",
            "post_ffw_norm": "post_feedforward_layernorm",
        },
        norm_plus_one=True,
        config=_gguf_config,
        chat_template=GEMMA_CHAT_TEMPLATE,
        stop_tokens=("<end_of_turn>",),
    ),
)
