"""StackedLinear: one stacked projection (q/k/v, gate/up) whose parts the file stores in
different GGUF types (common in Q4_K_M files: attn_v and ffn_down one step wider).

Each part keeps its own module (a QuantLinear on its kernel, or a DequantLinear where its
type has none) and the outputs are concatenated, so no part falls back to float. The
model's one-call decode step (csrc/decode_model.cpp) takes one kernel per projection; a
model with a StackedLinear runs its decode steps through the modules instead (the model
runner logs it).
"""

from __future__ import annotations

import torch
from torch import nn


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
