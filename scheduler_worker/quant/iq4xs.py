"""GGUF's IQ4_XS (form "iq4xs" of formats.py's table): 4-bit indices into a codebook of 16
int8 values, per super-block of 256 inputs a float16 d and per block of 32 a 6-bit scale
ls, as llama.cpp's block_iq4_xs (ggml-common.h) and dequantize_row_iq4_xs:

    w = d * (ls - 32) * KVALUES[q]          q in 0..15, KVALUES = kvalues_iq4nl

A file's block (136 bytes): d float16 | scales_h uint16 (bits 2b, 2b + 1: block b's top two
bits of ls) | scales_l 4 bytes (byte b/2's nibble b%2: ls's low four) | qs 128 bytes (block
b: 16 bytes, input j in byte j's low nibble, input 16 + j in its high one: Q4_0's order).

The arrays of a BlockWeight of this form: qs uint8 [N, K/2] (the file's nibbles), d float32
[N, K/256], sc int8 [N, K/32] (ls - 32). The kernels' layout (csrc/quant/formats.h) is
Q4_K's without the mins: per super-block sc [8 blocks][16 rows], then 8 nibble planes.
"""

from __future__ import annotations

import numpy as np
import torch

from scheduler_worker.quant import kquants
from scheduler_worker.quant.block_weight import BlockWeight

QK_K = 32 * 8
BLOCK_BYTES = 136
KVALUES = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)
_KVALUES = torch.tensor(KVALUES, dtype=torch.int32)


def split(raw: np.ndarray, type_name: str, n: int, k: int) -> BlockWeight:
    """The file's super-blocks [N, K/256 * 136] -> the arrays of the module docstring."""
    nu = k // QK_K
    blocks = np.ascontiguousarray(raw, dtype=np.uint8).reshape(n, nu, BLOCK_BYTES)
    d = np.ascontiguousarray(blocks[..., 0:2]).view(np.float16)[..., 0].astype(np.float32)
    scales_h = np.ascontiguousarray(blocks[..., 2:4]).view(np.uint16)  # [n, nu, 1]
    hi = (scales_h >> (2 * np.arange(8, dtype=np.uint16))) & 3  # [n, nu, 8]: ls's top 2 bits
    lo = (blocks[..., 4:8, None] >> np.array([0, 4], np.uint8)) & 15  # [n, nu, 4, 2]: low 4
    ls = lo.reshape(n, nu, 8).astype(np.int16) | (hi.astype(np.int16) << 4)
    sc = (ls - 32).astype(np.int8).reshape(n, nu * 8)
    qs = np.ascontiguousarray(blocks[..., 8:]).reshape(n, k // 2)
    t = torch.from_numpy
    return BlockWeight("iq4xs", t(qs), t(d), None, type_name, sc=t(sc))


def values(w: BlockWeight) -> tuple[torch.Tensor, torch.Tensor, None]:
    """(v int32 [N, K/32, 32] = KVALUES[q], dw float32 [N, K/32] = d * (ls - 32), no mw)."""
    assert w.sc is not None
    return (
        codebook_values(kquants.values(w.qs, None)),
        w.d.repeat_interleave(8, dim=1) * w.sc.float(),
        None,
    )


def codebook_values(q: torch.Tensor) -> torch.Tensor:
    """Nibbles (int32, any shape) -> KVALUES[q] int32."""
    return _KVALUES[q.long()]


def pack(w: BlockWeight) -> tuple[torch.Tensor, torch.Tensor, None]:
    """The kernels' layout: Q4_K's nibble planes and scale bytes (sc's int8 bits), no m."""
    assert w.sc is not None
    packed, d16, _ = kquants.pack(w.qs, None, w.d, None, w.sc.view(torch.uint8), None)
    return packed, d16, None
