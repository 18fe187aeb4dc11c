"""Granite 3 (GraniteForCausalLM): the llama layout with four multipliers — embeddings
scaled, a set softmax scale, each attention and MLP output scaled before it joins the
residual, logits divided. llama.cpp's `granite` files permute Q and K as llama's and keep
the multipliers as metadata. The one-call C++ decode step has no residual multiplier:
Granite's decode steps run the layers one by one."""

from __future__ import annotations

from common.families.base import Family, GGUFSpec, Read, decoder_args


def _args(hf: dict) -> dict:
    return {
        **decoder_args(hf),
        "embedding_scale": float(hf.get("embedding_multiplier", 1.0)),
        "attention_scale": float(hf.get("attention_multiplier", 1.0)),
        "residual_multiplier": float(hf.get("residual_multiplier", 1.0)),
        "logit_divisor": float(hf.get("logits_scaling", 1.0)),
    }


def _gguf_config(read: Read, config: dict) -> dict:
    return {  # config.json's keys; llama.cpp: no attention.scale is 1/sqrt(head_dim)
        "embedding_multiplier": read("granite.embedding_scale", 1.0),
        "attention_multiplier": read("granite.attention.scale", config["head_dim"] ** -0.5),
        "residual_multiplier": read("granite.residual_scale", 1.0),
        "logits_scaling": read("granite.logit_scale", 1.0),
    }


GRANITE = Family(
    "granite",
    ("GraniteForCausalLM",),
    _args,
    decode_style=None,
    gguf=GGUFSpec("granite", "granite", qk_permuted=True, config=_gguf_config),
)
