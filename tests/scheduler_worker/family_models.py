"""Tiny random checkpoints of every family with the GPU kernels' real head shapes (head_dim
64, 6 query heads over 2 KV heads; GPT-2: 6 heads), for the backend tests: the Triton op
set on the CPU (test_triton_backend.py) and the CUDA backend on a GPU
(test_cuda_backend.py)."""

from __future__ import annotations

from pathlib import Path

import torch

from tests.conftest import tiny_config

SHAPE = dict(
    vocab_size=256, eos_token_id=2, hidden_size=384, intermediate_size=256, num_hidden_layers=2,
    num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=256,
    initializer_range=0.05,
)  # fmt: skip
FAMILIES = {  # HF config class, model class, what the family adds
    "mistral": ("MistralConfig", "MistralForCausalLM", {"sliding_window": 16, "head_dim": 64}),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", {"sliding_window": 16, "pad_token_id": 0}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}),  # q / k / v biases
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {"head_dim": 64}),  # QK-norm
    "granite": (
        "GraniteConfig",
        "GraniteForCausalLM",
        {
            "embedding_multiplier": 3.0,
            "attention_multiplier": 0.1,
            "residual_multiplier": 0.5,
            "logits_scaling": 4.0,
        },
    ),  # fmt: skip
    # per-head q / k norms on [T, H, D], sandwich norms, a local layer (window 16) and a
    # global one
    "gemma3": (
        "Gemma3TextConfig",
        "Gemma3ForCausalLM",
        {
            "head_dim": 64,
            "sliding_window": 16,
            "layer_types": ["sliding_attention", "full_attention"],
        },
    ),  # fmt: skip
    "gpt2": ("GPT2Config", "GPT2LMHeadModel", {}),  # LayerNorm, learned positions, MHA
}


def save_family(family: str, out: Path) -> Path:
    """The family's tiny model (torch seed 0), saved to `out`."""
    import transformers

    config_class, model_class, extra = FAMILIES[family]
    if family == "gpt2":
        config = transformers.GPT2Config(
            vocab_size=256, n_embd=384, n_layer=2, n_head=6, n_positions=256, eos_token_id=2
        )
    else:
        config = tiny_config(config_class, **{**SHAPE, **extra})
    torch.manual_seed(0)
    getattr(transformers, model_class)(config).eval().save_pretrained(out)
    return out
