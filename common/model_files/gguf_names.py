"""GGUF tensor names -> our HF module names: the top-level tensors here, each layer's from
its family's GGUFSpec.layer_names (common/families). The conversion
(common.model_files.gguf_convert) and the engine's loader read them."""

from __future__ import annotations

import re

from common.families import SUPPORTED_GGUF_ARCHS, gguf_spec

__all__ = ["SUPPORTED_GGUF_ARCHS", "TOP_NAMES", "hf_name", "layer_tensor_names"]

TOP_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}


def layer_tensor_names(arch: str) -> tuple[str, ...]:
    """The layer tensors (blk.N.<name>) a file of `arch` must hold."""
    return tuple(gguf_spec(arch).layer_names)


def hf_name(name: str, arch: str = "llama") -> str | None:
    if name in TOP_NAMES:
        return TOP_NAMES[name]
    layer_names = gguf_spec(arch).layer_names
    m = re.fullmatch(r"blk\.(\d+)\.(\w+)\.(weight|bias)", name)
    if m and m.group(2) in layer_names:
        return f"model.layers.{m.group(1)}.{layer_names[m.group(2)]}.{m.group(3)}"
    return None
