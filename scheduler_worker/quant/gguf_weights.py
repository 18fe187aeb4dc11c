"""A GGUF file's matrices as the model's modules, read from the file's memory map.

    GGUF file ─▶ blk.N.attn_q/k/v ─(rows un-permuted, stacked)─▶ layers.N.self_attn.qkv_proj
                 blk.N.attn_output ─────────────────────────────▶ layers.N.self_attn.o_proj
                 blk.N.ffn_gate/up ─(stacked)───────────────────▶ layers.N.mlp.gate_up_proj
                 blk.N.ffn_down ────────────────────────────────▶ layers.N.mlp.down_proj
                 output (or token_embd when tied) ──────────────▶ lm_head
                 token_embd ────────────────────────────────────▶ embed_tokens

Each linear becomes, by its GGUF type: a QuantLinear on the integer kernels (the types in
formats.GGUF_BLOCK_TYPES, whatever that table holds), or a DequantLinear (the file's bytes,
dequantized a chunk of rows at a time) for a type without a kernel; a stacked projection
whose parts differ in kernel form or type becomes a StackedLinear of per-part modules.
None keeps a float copy of the weight. The embedding stays in the file (QuantEmbedding).
llama.cpp permutes the Q and K rows of some architectures' files (GGUFSpec.qk_permuted);
rows are whole blocks, so they are un-permuted as blocks. Which tensors stack into which
module is the family's (GGUFSpec.linears, common/families).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from common.families import BY_GGUF_ARCH
from common.model_files.gguf_convert import unpermute
from common.model_files.gguf_header import gguf_blocks_header
from scheduler_worker.quant.dequant_linear import DequantLinear
from scheduler_worker.quant.embedding import QuantEmbedding
from scheduler_worker.quant.formats import GGUF_BLOCK_TYPES, cat_rows, from_gguf, kernel_label
from scheduler_worker.quant.linear import QuantLinear
from scheduler_worker.quant.stacked import StackedLinear

NO_KERNEL = "dequant-on-the-fly (no kernel)"


class GGUFBlocks:
    """The tensors of one GGUF file, by GGUF name, as views of its memory map."""

    def __init__(self, path: Path) -> None:
        import gguf

        self.path = path
        header = gguf_blocks_header(path)  # the tensor table only, no vocabulary (fast)
        self.arch = str(header.get("general.architecture"))
        self.n_head = int(header.get(f"{self.arch}.attention.head_count", 0))
        self.n_kv_head = int(header.get(f"{self.arch}.attention.head_count_kv", self.n_head))
        self.tensors = {t.name: t for t in header.tensors}
        family = BY_GGUF_ARCH.get(self.arch)
        self.spec = family.gguf if family is not None else None
        self.qk_permuted = self.spec is not None and self.spec.qk_permuted
        self._types = gguf.GGMLQuantizationType

    def type_name(self, name: str) -> str:
        return self._types(self.tensors[name].tensor_type).name

    def types(self) -> dict[str, int]:
        """How many tensors of each GGUF type the file holds (for the log)."""
        out: dict[str, int] = {}
        for name in self.tensors:
            out[self.type_name(name)] = out.get(self.type_name(name), 0) + 1
        return out

    def tensor_bytes(self) -> int:
        """The bytes of every tensor in the file (what the weight memory is measured against)."""
        return sum(int(t.n_bytes) for t in self.tensors.values())

    def shape(self, name: str) -> tuple[int, int]:
        k, n = (int(x) for x in self.tensors[name].shape)  # GGUF lists ne0 (the input dim) first
        return n, k

    def rows(self, name: str) -> np.ndarray:
        """The tensor's rows as stored ([N, row bytes], or [N, K] for float types), a view of
        the memory map; Q/K rows un-permuted (a copy) where the file permutes them."""
        n, _ = self.shape(name)
        raw = np.asarray(self.tensors[name].data).reshape(n, -1)
        if self.qk_permuted and name.endswith(("attn_q.weight", "attn_k.weight")):
            raw = unpermute(raw, self.n_head if "attn_q" in name else self.n_kv_head)
        return raw


@dataclass(frozen=True)
class Served:
    """One GGUF tensor and what serves it (the start-up log's lines)."""

    tensor: str
    type_name: str
    path: str  # "qlinear q4 avx512", NO_KERNEL, "embedding rows on lookup", ...


def _one(
    blocks: GGUFBlocks,
    names: tuple[str, ...],
    bias: torch.Tensor | None,
    dtype: torch.dtype,
    isa: str | None,
    dense_dtype: torch.dtype | None,
) -> tuple[nn.Module, list[Served]]:
    """The module for GGUF tensors `names` stacked along the output dim."""
    types = [blocks.type_name(n) for n in names]
    k = blocks.shape(names[0])[1]
    if all(t in GGUF_BLOCK_TYPES for t in types):
        parts = [from_gguf(blocks.rows(n), t, blocks.shape(n)[0], k) for n, t in zip(names, types)]
        if len({p.form for p in parts}) == 1:
            q = QuantLinear(cat_rows(parts), bias, dtype, isa, dense_dtype)
            how = kernel_label(parts[0].form, isa) if isa else "pure torch (dequantized float)"
            return q, [Served(n, t, how) for n, t in zip(names, types)]
    if len(set(types)) == 1 and types[0] not in GGUF_BLOCK_TYPES:
        raw = np.concatenate([blocks.rows(n) for n in names]) if len(names) > 1 else None
        raw = blocks.rows(names[0]) if raw is None else raw
        lin = DequantLinear(raw, types[0], raw.shape[0], k, bias)
        return lin, [Served(n, t, NO_KERNEL) for n, t in zip(names, types)]
    modules, served = [], []  # mixed types: one module per part, outputs concatenated
    for n in names:
        mod, s = _one(blocks, (n,), None, dtype, isa, dense_dtype)
        modules.append(mod)
        served += s
    return StackedLinear(modules, k, bias), served


def _set(model: nn.Module, name: str, new: nn.Module) -> nn.Module:
    parent_name, _, attr = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    old = getattr(parent, attr)
    setattr(parent, attr, new)
    return old


def swap_in_gguf(
    model: nn.Module,
    blocks: GGUFBlocks,
    num_layers: int,
    dtype: torch.dtype,
    isa: str | None,
    dense_dtype: torch.dtype | None,
) -> tuple[list[Served], list[str]]:
    """Replace the (meta-device) model's linears and embedding by modules over the file's
    tensors. Returns what serves each tensor, and the stacked projections whose parts
    differ in type (served part by part)."""
    if blocks.spec is None:
        raise ValueError(f"no GGUF tensor map for architecture {blocks.arch!r}")
    layer, embed_name, output_name = blocks.spec.linears(), "embed_tokens", "lm_head"
    plan = {
        f"layers.{i}.{ours}": tuple(f"blk.{i}.{p}.weight" for p in parts)
        for i in range(num_layers)
        for ours, parts in layer.items()
    }
    plan[output_name] = (
        ("output.weight",) if "output.weight" in blocks.tensors else ("token_embd.weight",)
    )
    served: list[Served] = []
    mixed: list[str] = []
    for ours, names in plan.items():
        old = model.get_submodule(ours)
        n = sum(blocks.shape(x)[0] for x in names)
        if not isinstance(old, nn.Linear) or (old.out_features, old.in_features) != (
            n,
            blocks.shape(names[0])[1],
        ):
            raise ValueError(f"{ours}: expected an nn.Linear of {n} outputs, found {old}")
        new, s = _one(blocks, names, old.bias, dtype, isa, dense_dtype)
        if isinstance(new, StackedLinear):
            mixed.append(f"{ours} ({new.source})")
        _set(model, ours, new)
        served += s
    embd = "token_embd.weight"
    _, dim = blocks.shape(embd)
    _set(model, embed_name, QuantEmbedding(blocks.rows(embd), blocks.type_name(embd), dim, dtype))
    served.append(Served(embd, blocks.type_name(embd), "embedding rows dequantized on lookup"))
    return served, mixed
