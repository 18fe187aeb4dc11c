"""Phi-3: the llama layout with q/k/v and gate/up already fused in its checkpoints (they
load as they are) and a sliding window on every layer."""

from __future__ import annotations

from common.families.base import Family, GGUFSpec, decoder_args

PHI3 = Family(
    "phi3",
    ("Phi3ForCausalLM",),
    decoder_args,
    sliding="every_layer",
    gguf=GGUFSpec(
        "phi3",
        "phi3",
        {  # attn_qkv, and ffn_up holding gate then up
            "attn_qkv": "self_attn.qkv_proj",
            "attn_output": "self_attn.o_proj",
            "ffn_up": "mlp.gate_up_proj",
            "ffn_down": "mlp.down_proj",
            "attn_norm": "input_layernorm",
            "ffn_norm": "post_attention_layernorm",
        },
    ),
)
