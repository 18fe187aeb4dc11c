"""StackedLinear: one stacked projection (q/k/v, gate/up) whose parts the file stores in
different GGUF types (common in Q4_K_M files: attn_v and ffn_down one step wider).

Each part keeps its own module (a QuantLinear on its kernel, or a DequantLinear where its
type has none) and the outputs are concatenated, so no part falls back to float. The
model's one-call decode step (csrc/decode_model.cpp) takes a projection as its parts
(`kernel_parts`) and concatenates their outputs as `forward` does, as long as every part
is kernel-served.
"""

from __future__ import annotations

from typing import cast

import torch
from torch import nn

from scheduler_worker.quant.linear import QuantLinear


class StackedLinear(nn.Module):
    def __init__(self, parts: list[nn.Module], in_features: int, bias: torch.Tensor | None):
        super().__init__()
        self.parts = nn.ModuleList(parts)
        self.in_features = in_features
        widths: list[int] = [p.out_features for p in parts]  # type: ignore[misc]
        self.out_features = sum(widths)
        self.source = "+".join(str(p.source) for p in parts)
        self.bias = None if bias is None else nn.Parameter(bias.detach(), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.cat([p(x) for p in self.parts], dim=-1)
        return y if self.bias is None else y + self.bias

    def extra_repr(self) -> str:
        return f"{self.in_features}, {self.out_features}, parts {self.source}"


def kernel_parts(lin: nn.Module) -> list[QuantLinear] | None:
    """The integer-kernel linears that make up `lin` (itself, or a StackedLinear's parts), or
    None when some part is not served by the kernels (the one-call decode step cannot
    take it)."""
    parts = list(lin.parts) if isinstance(lin, StackedLinear) else [lin]
    if not all(isinstance(p, QuantLinear) and p.isa is not None for p in parts):
        return None
    if len(parts) > 1 and any(p.bias is not None for p in parts):
        return None  # a stack carries one bias for the whole projection
    return cast(list[QuantLinear], parts)
