"""A GGUF file's own quantized blocks, swapped into a model loaded from its conversion.

    GGUF file ─▶ blk.N.attn_q/k/v ─(rows un-permuted, stacked)─▶ layers.N.self_attn.qkv_proj
                 blk.N.attn_output ─────────────────────────────▶ layers.N.self_attn.o_proj
                 blk.N.ffn_gate/up ─(stacked)───────────────────▶ layers.N.mlp.gate_up_proj
                 blk.N.ffn_down ────────────────────────────────▶ layers.N.mlp.down_proj
                 output (or token_embd when tied) ──────────────▶ lm_head

The model itself comes from the cached HF-format conversion (common.gguf_convert), so the
norms, the embedding table and any bias hold the same values; only the linears change
from dequantized float to the file's blocks. llama.cpp permutes the Q and K rows of
llama-architecture files; rows are whole blocks, so they are un-permuted as blocks. A
layer whose tensors are not all in a kernel format (Q4_0, Q4_1, Q8_0), or mix 4- and
8-bit forms, keeps its dequantized float weight; the caller logs which.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from common.gguf_convert import inspect_gguf, unpermute
from scheduler_worker.quant.formats import GGUF_BLOCK_TYPES, BlockWeight, cat_rows, from_gguf

# our module -> the GGUF tensors stacked into it, per layer ("{i}") or top level
_LAYER_PARTS = {
    "self_attn.qkv_proj": ("attn_q", "attn_k", "attn_v"),
    "self_attn.o_proj": ("attn_output",),
    "mlp.gate_up_proj": ("ffn_gate", "ffn_up"),
    "mlp.down_proj": ("ffn_down",),
}
# architectures laid out otherwise (llama, qwen2, qwen3, gemma3 take _LAYER_PARTS)
_LAYER_PARTS_BY_ARCH = {
    "phi3": {  # q/k/v and gate/up already fused in the file
        "self_attn.qkv_proj": ("attn_qkv",),
        "self_attn.o_proj": ("attn_output",),
        "mlp.gate_up_proj": ("ffn_up",),
        "mlp.down_proj": ("ffn_down",),
    },
}


class GGUFBlocks:
    """The quantized tensors of one GGUF file, by GGUF name (the file is memory-mapped)."""

    def __init__(self, path: Path) -> None:
        import gguf

        self.path = path
        reader = inspect_gguf(path)
        self.arch = str(reader.fields["general.architecture"].contents())
        heads = reader.fields.get(f"{self.arch}.attention.head_count")
        kv_heads = reader.fields.get(f"{self.arch}.attention.head_count_kv")
        self.n_head = int(heads.contents()) if heads else 0
        self.n_kv_head = int(kv_heads.contents()) if kv_heads else self.n_head
        self.tensors = {t.name: t for t in reader.tensors}
        self._types = gguf.GGMLQuantizationType

    def type_name(self, name: str) -> str:
        return self._types(self.tensors[name].tensor_type).name

    def types(self) -> dict[str, int]:
        """How many tensors of each GGUF type the file holds (for the log)."""
        out: dict[str, int] = {}
        for name in self.tensors:
            out[self.type_name(name)] = out.get(self.type_name(name), 0) + 1
        return out

    def block_weight(self, name: str) -> BlockWeight | None:
        """The tensor as kernel blocks, or None when its type has no kernel."""
        t = self.tensors[name]
        type_name = self.type_name(name)
        if type_name not in GGUF_BLOCK_TYPES:
            return None
        k, n = (int(x) for x in t.shape)  # GGUF lists ne0 (the input dim) first
        raw = np.asarray(t.data).reshape(n, -1)
        if self.arch == "llama" and name.endswith(("attn_q.weight", "attn_k.weight")):
            raw = unpermute(raw, self.n_head if "attn_q" in name else self.n_kv_head)
        return from_gguf(raw, type_name, n, k)


def gguf_linears(blocks: GGUFBlocks, num_layers: int) -> tuple[dict[str, BlockWeight], list[str]]:
    """(our module name -> stacked blocks, names of linears left in float and why)."""
    found: dict[str, BlockWeight] = {}
    skipped: list[str] = []
    plan = {
        f"layers.{i}.{ours}": tuple(f"blk.{i}.{p}.weight" for p in parts)
        for i in range(num_layers)
        for ours, parts in _LAYER_PARTS_BY_ARCH.get(blocks.arch, _LAYER_PARTS).items()
    }
    plan["lm_head"] = (
        ("output.weight",) if "output.weight" in blocks.tensors else ("token_embd.weight",)
    )
    for ours, names in plan.items():
        parts = [blocks.block_weight(n) for n in names]
        if any(p is None for p in parts):
            types = ", ".join(sorted({blocks.type_name(n) for n in names}))
            skipped.append(f"{ours} ({types})")
            continue
        try:
            found[ours] = cat_rows([p for p in parts if p is not None])
        except ValueError:
            skipped.append(f"{ours} (mixed {', '.join(blocks.type_name(n) for n in names)})")
    return found, skipped
