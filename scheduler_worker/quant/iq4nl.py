"""GGUF's IQ4_NL (form "iq4nl" of formats.py's table): IQ4_XS's codebook per block of 32
with a float16 d of its own, as llama.cpp's block_iq4_nl and dequantize_row_iq4_nl:

    w = d * KVALUES[q]          q in 0..15, KVALUES = kvalues_iq4nl (iq4xs.py)

A file's block (18 bytes): d float16 | qs 16 bytes (Q4_0's order). llama-quantize writes it
where IQ4_XS does not fit (rows not a multiple of 256). The arrays of a BlockWeight of this
form: qs uint8 [N, K/2], d float32 [N, K/32]; the kernels' layout is Q4_0's, without m.
"""

from __future__ import annotations

import numpy as np
import torch

from scheduler_worker.quant import iq4xs, kquants, q4q8
from scheduler_worker.quant.block_weight import BlockWeight


def split(raw: np.ndarray, type_name: str, n: int, k: int) -> BlockWeight:
    """The file's blocks [N, K/32 * 18] -> the arrays of the module docstring."""
    blocks = np.ascontiguousarray(raw, dtype=np.uint8).reshape(n, k // 32, 18)
    d = np.ascontiguousarray(blocks[..., 0:2]).view(np.float16)[..., 0].astype(np.float32)
    qs = np.ascontiguousarray(blocks[..., 2:]).reshape(n, k // 2)
    return BlockWeight("iq4nl", torch.from_numpy(qs), torch.from_numpy(d), None, type_name)


def values(w: BlockWeight) -> tuple[torch.Tensor, torch.Tensor, None]:
    """(v int32 [N, K/32, 32] = KVALUES[q], dw = d [N, K/32], no mw): exact."""
    return iq4xs.codebook_values(kquants.values(w.qs, None)), w.d, None


def pack(w: BlockWeight) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """The kernels' layout: Q4_0's nibble planes and d, no m."""
    return q4q8.pack(w.qs, w.d, None, False)
