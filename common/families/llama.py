"""Llama (Llama 2/3, SmolLM2) and Mistral: the llama layout as it is. llama.cpp writes
Mistral's files as `llama` too, so only Llama has a GGUF spec."""

from __future__ import annotations

from common.families.base import Family, GGUFSpec, decoder_args

LLAMA = Family(
    "llama",
    ("LlamaForCausalLM",),
    decoder_args,
    tool_format_markers=(("<|python_tag|>", "llama3_json"),),  # Llama 3.1's template
    gguf=GGUFSpec("llama", "llama", qk_permuted=True),
)
MISTRAL = Family(
    "mistral",
    ("MistralForCausalLM",),
    decoder_args,
    sliding="every_layer",  # its sliding_window: every layer
    tool_format="mistral",
)
