"""The model families zeroserve serves, one file each (base.py says what a Family holds).
Torch-free: the GGUF conversion reads them too.

Adding a family: its file here, and its line in FAMILIES.
"""

from __future__ import annotations

from common.families.base import Family, GGUFSpec
from common.families.gemma3 import GEMMA3
from common.families.gpt2 import GPT2
from common.families.gpt_neox import GPT_NEOX
from common.families.granite import GRANITE
from common.families.llama import LLAMA, MISTRAL
from common.families.olmo2 import OLMO2
from common.families.phi3 import PHI3
from common.families.qwen import QWEN2, QWEN3

FAMILIES: tuple[Family, ...] = (
    LLAMA,
    MISTRAL,
    QWEN2,
    QWEN3,
    PHI3,
    GPT2,
    GEMMA3,
    GRANITE,
    OLMO2,
    GPT_NEOX,
)

BY_ARCHITECTURE = {arch: f for f in FAMILIES for arch in f.hf_architectures}
BY_GGUF_ARCH = {f.gguf.arch: f for f in FAMILIES if f.gguf is not None}
SUPPORTED_GGUF_ARCHS = tuple(BY_GGUF_ARCH)


def gguf_spec(arch: str) -> GGUFSpec:
    """The GGUFSpec of a GGUF general.architecture (KeyError if none serves it)."""
    spec = BY_GGUF_ARCH[arch].gguf
    assert spec is not None
    return spec


def gguf_family(arch: str) -> Family:
    return BY_GGUF_ARCH[arch]


def family_of_config(hf: dict) -> Family | None:
    """The family of an HF config.json: by its `architectures`, else by its `model_type`
    (a family's name); None for a family not served."""
    for arch in hf.get("architectures") or []:
        if arch in BY_ARCHITECTURE:
            return BY_ARCHITECTURE[arch]
    kind = str(hf.get("model_type", "")).lower()
    return next((f for f in FAMILIES if f.name == kind), None)
