"""What the model's weights cost and what serves them: the start-up log and the
`zeroserve:model_weight_bytes` gauge.

    held   = packed (QuantLinear blocks) + raw (DequantLinear's file bytes)
           + float (every other parameter and buffer: norms, biases, rope tables, any
             dense copy)
    mapped = the embedding rows left in the file (read on lookup: page cache, not held)
    ratio  = held / the file's tensor bytes
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

import torch
from torch import nn

from scheduler_worker.quant.dequant_linear import DequantLinear
from scheduler_worker.quant.embedding import QuantEmbedding
from scheduler_worker.quant.gguf_weights import Served
from scheduler_worker.quant.linear import QuantLinear

MB = 1e6


def _nbytes(tensors: Iterable[torch.Tensor | None]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


@dataclass(frozen=True)
class WeightMemory:
    packed_bytes: int
    raw_bytes: int
    float_bytes: int
    mapped_bytes: int
    file_bytes: int | None  # the GGUF file's tensor bytes (None: not a GGUF model)

    @property
    def held_bytes(self) -> int:
        return self.packed_bytes + self.raw_bytes + self.float_bytes

    @property
    def ratio(self) -> float | None:
        return None if not self.file_bytes else self.held_bytes / self.file_bytes

    def describe(self) -> str:
        text = (
            f"weights held {self.held_bytes / MB:.1f} MB (kernel blocks "
            f"{self.packed_bytes / MB:.1f}, file bytes dequantized on the fly "
            f"{self.raw_bytes / MB:.1f}, float {self.float_bytes / MB:.1f})"
        )
        if self.mapped_bytes:
            text += f", embedding {self.mapped_bytes / MB:.1f} MB left in the file"
        if self.file_bytes:
            text += f"; the file's tensors: {self.file_bytes / MB:.1f} MB, {self.ratio:.2f}x"
        return text


def weight_memory(model: nn.Module, file_bytes: int | None) -> WeightMemory:
    packed = raw = flt = mapped = 0
    seen: set[int] = set()  # tied parameters count once
    for mod in model.modules():
        if isinstance(mod, QuantEmbedding):
            mapped += mod.mapped_bytes()
            continue
        for name, t in [*mod.named_parameters(recurse=False), *mod.named_buffers(recurse=False)]:
            if t is None or id(t) in seen:
                continue
            seen.add(id(t))
            size = _nbytes([t])
            if isinstance(mod, QuantLinear) and name in ("qs", "d", "m"):
                packed += size
            elif isinstance(mod, DequantLinear) and name == "raw":
                raw += size
            else:
                flt += size
        if isinstance(mod, QuantLinear):
            flt += _nbytes([mod.dense])  # a plain attribute, not a buffer
    return WeightMemory(packed, raw, flt, mapped, file_bytes)


def kernel_lines(served: list[Served]) -> list[str]:
    """One line per (GGUF type, path): "Q4_1 x 210 -> qlinear q4 avx512"."""
    counts = Counter((s.type_name, s.path) for s in served)
    return [f"{t} x {n} -> {path}" for (t, path), n in sorted(counts.items())]
