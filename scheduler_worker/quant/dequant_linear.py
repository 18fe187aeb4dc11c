"""Rows of GGUF blocks turned into float, and the linear that does it on the fly for the
GGUF types no kernel serves (Q2_K, Q3_K, the IQ2 and IQ3 types, ... until one does).

    raw file bytes [N, row bytes] ──forward──▶ CHUNK rows dequantized ─▶ x @ rowsᵀ ─▶ discarded
                                                (next chunk, same buffer size)

The layer holds the file's bytes, never a float copy: its memory is the file's, and a
forward costs one dequantization of the weight (the price of having no kernel; the server
logs which tensors pay it). `dequantize_rows` serves the embedding's lookups too: the
kernel formats (scheduler_worker.quant.formats) in torch, every other type through
gguf-py's numpy reference.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from scheduler_worker.quant import formats

# floats dequantized per chunk: 1M (4 MiB) keeps the scratch in the L2/L3 caches' range
CHUNK_ELEMS = 1 << 20


def torch_rows(rows: torch.Tensor, type_name: str, k: int) -> torch.Tensor | None:
    """The float32 rows [n, k] of GGUF rows held as a torch tensor, in torch, for the
    file formats llama.cpp's converter writes embeddings in (F32, F16, Q8_0, Q4_0, Q4_1),
    with gguf-py's arithmetic (float32 d * q [+ m]); None for any other type."""
    n = rows.shape[0]
    if type_name in ("F32", "F16", "BF16") and rows.is_floating_point():
        return rows.float().reshape(n, k)
    layout = {"Q8_0": 34, "Q4_0": 18, "Q4_1": 20}.get(type_name)
    if layout is None or rows.dtype != torch.uint8:
        return None
    b = rows.reshape(n, k // 32, layout)
    d = b[..., 0:2].contiguous().view(torch.float16).float()  # [n, nb, 1]
    if type_name == "Q8_0":
        return (b[..., 2:].contiguous().view(torch.int8).float() * d).reshape(n, k)
    qs = b[..., layout - 16 :]
    q = torch.cat([qs & 15, qs >> 4], dim=-1).float()
    if type_name == "Q4_0":
        return ((q - 8) * d).reshape(n, k)
    m = b[..., 2:4].contiguous().view(torch.float16).float()
    return (q * d + m).reshape(n, k)


def dequantize_rows(raw: np.ndarray, type_name: str, k: int) -> torch.Tensor:
    """GGUF rows ([n, row bytes], or the file's float array [n, k]) -> float32 [n, k]."""
    import gguf

    n = raw.shape[0]
    if type_name in formats.GGUF_BLOCK_TYPES:
        return formats.dequantize(formats.from_gguf(raw, type_name, n, k))
    qtype = gguf.GGMLQuantizationType[type_name]
    out = gguf.quants.dequantize(np.ascontiguousarray(raw), qtype)
    return torch.from_numpy(np.ascontiguousarray(out, dtype=np.float32).reshape(n, k))


class DequantLinear(nn.Module):
    """nn.Linear's forward over GGUF rows kept as the file has them (any type gguf-py
    dequantizes), dequantized `chunk_rows` at a time."""

    raw: torch.Tensor

    def __init__(
        self, raw: np.ndarray, type_name: str, n: int, k: int, bias: torch.Tensor | None = None
    ) -> None:
        super().__init__()
        if raw.shape[0] != n:
            raise ValueError(f"{type_name} weight: {raw.shape[0]} rows, expected {n}")
        self.out_features, self.in_features = n, k
        self.source = type_name
        self.register_buffer("raw", torch.from_numpy(np.array(raw)))  # a copy of the bytes
        self.chunk_rows = max(1, CHUNK_ELEMS // k)
        self.bias = None if bias is None else nn.Parameter(bias.detach(), requires_grad=False)

    def rows(self, start: int, end: int) -> torch.Tensor:
        """Weight rows [start, end) as float32."""
        return dequantize_rows(self.raw[start:end].numpy(), self.source, self.in_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2 = x.reshape(-1, self.in_features).float()
        out = torch.empty(x2.shape[0], self.out_features, dtype=torch.float32)
        for start in range(0, self.out_features, self.chunk_rows):
            end = min(start + self.chunk_rows, self.out_features)
            out[:, start:end] = F.linear(x2, self.rows(start, end))
        if self.bias is not None:
            out += self.bias
        return out.to(x.dtype).reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"{self.in_features}, {self.out_features}, {self.source} dequantized on the fly"
