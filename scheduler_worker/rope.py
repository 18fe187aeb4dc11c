"""Rotary position embeddings (the rotate-half layout Hugging Face Llama uses).

Supported `rope_type`s: default, linear, llama3. cos/sin are precomputed once in
float32 for every position up to the model's context length and indexed by position, or,
with `table=False`, computed for each step's positions (the same float32 products): a
model with a long context and wide heads would otherwise hold tables the size of a good
part of its weights (Gemma 3 270M: two tables of 32,768 x 128 x 2 floats, 67 MB beside
247 MB of weights).
"""

from __future__ import annotations

import math
from typing import Any

import torch

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")


def _inv_freq(head_dim: int, theta: float) -> torch.Tensor:
    """On the CPU even while a model is built on the meta device (a few floats): on meta,
    this division runs through a Python decomposition whose first call imports
    torch._dynamo, a second or two of the scheduler's start."""
    exps = torch.arange(0, head_dim, 2, dtype=torch.int64, device="cpu").float() / head_dim
    return 1.0 / (theta**exps)


def _llama3_inv_freq(inv_freq: torch.Tensor, scaling: dict[str, Any]) -> torch.Tensor:
    factor = float(scaling["factor"])
    low_freq_factor = float(scaling.get("low_freq_factor", 1.0))
    high_freq_factor = float(scaling.get("high_freq_factor", 4.0))
    old_len = float(scaling.get("original_max_position_embeddings", 8192))
    low_freq_wavelen = old_len / low_freq_factor
    high_freq_wavelen = old_len / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    # long wavelengths are scaled down by `factor`, short ones kept, the middle band blended
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return torch.where(is_medium, blended, scaled)


class RotaryEmbedding(torch.nn.Module):
    cos: torch.Tensor  # [max_positions, head_dim/2] buffers, float32 until the model's .to()
    sin: torch.Tensor

    def __init__(
        self,
        head_dim: int,
        max_positions: int,
        theta: float,
        scaling: dict[str, Any] | None = None,
        table: bool = True,
    ) -> None:
        super().__init__()
        rope_type = (scaling or {}).get("rope_type", (scaling or {}).get("type", "default"))
        if rope_type not in SUPPORTED_ROPE_TYPES:
            raise ValueError(
                f"unsupported rope scaling type {rope_type!r}; supported: {SUPPORTED_ROPE_TYPES}"
            )
        inv_freq = _inv_freq(head_dim, theta)
        self.position_factor = 1.0  # linear scaling divides the positions by it
        if rope_type == "llama3":
            inv_freq = _llama3_inv_freq(inv_freq, scaling or {})
        elif rope_type == "linear":
            self.position_factor = float((scaling or {})["factor"])
        # float32 always: a plain attribute, so a model cast to bf16 does not round it
        self.inv_freq: torch.Tensor = inv_freq
        self._tables_f32: tuple[torch.Tensor, torch.Tensor] | None = None
        self.table = table
        if table and torch.get_default_device().type == "meta":
            # a model built on the meta device remakes its rope after (post_init); computing
            # on meta would run Python decompositions that import torch._dynamo
            shape = (max_positions, inv_freq.shape[0])
            self.register_buffer("cos", torch.empty(shape), persistent=False)
            self.register_buffer("sin", torch.empty(shape), persistent=False)
        elif table:
            freqs = self.freqs(torch.arange(max_positions))  # [max_positions, head_dim/2]
            self.register_buffer("cos", freqs.cos(), persistent=False)
            self.register_buffer("sin", freqs.sin(), persistent=False)

    def tables_f32(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The cos / sin tables in float32, contiguous (what the C++ and Triton RoPE ops
        read, whatever the model's dtype): made once, on the tables' device."""
        tables = getattr(self, "_tables_f32", None)
        if tables is None or tables[0].device != self.cos.device:
            tables = self._tables_f32 = (
                self.cos.float().contiguous(),
                self.sin.float().contiguous(),
            )
        return tables

    def freqs(self, positions: torch.Tensor) -> torch.Tensor:
        """position x inverse frequency, float32 [T, head_dim/2]: cos/sin of it rotate."""
        p = positions.to(torch.float32)
        if self.position_factor != 1.0:
            p = p / self.position_factor
        if self.inv_freq.device != p.device:  # once: a copy inside a CUDA graph is an error
            self.inv_freq = self.inv_freq.to(p.device)
        return torch.outer(p, self.inv_freq)

    def cos_sin(
        self, positions: torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin for these positions, [T, 1, head_dim/2]: computed once per forward and
        shared by every layer."""
        if not self.table:
            freqs = self.freqs(positions)
            return freqs.cos().unsqueeze(1).to(dtype), freqs.sin().unsqueeze(1).to(dtype)
        return (
            self.cos[positions].unsqueeze(1).to(dtype),
            self.sin[positions].unsqueeze(1).to(dtype),
        )

    def forward(
        self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """q: [T, num_heads, head_dim], k: [T, num_kv_heads, head_dim]."""
        cos, sin = self.cos_sin(positions, q.dtype)
        return rotate(q, cos, sin), rotate(k, cos, sin)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE on x [T, heads, head_dim] with cos/sin [T, 1, head_dim/2]."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
