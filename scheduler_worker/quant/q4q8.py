"""GGUF's Q4_0, Q4_1 and Q8_0 (the forms "q4" and "q8" of formats.py's table): split from
the file's blocks and repacked for the kernels (csrc/quant/formats.h).

    form "q4":  w = d * q + m,  q in 0..15 (two per byte, GGUF's nibble order)
                Q4_1 as stored (d, m); Q4_0 is q4 with m = -8 d.
    form "q8":  w = d * q,      q in -127..127 (int8): Q8_0 as stored.

d and m are widened to float32 arrays [N, K/32] (exact); `pack` narrows them back to
float16, interleaved with the values 16 rows at a time.
"""

from __future__ import annotations

import numpy as np
import torch

from scheduler_worker.quant.groups import GROUP_ROWS, groups, pack_scales, words

QK = 32


def split(
    raw: np.ndarray, type_name: str, n: int, k: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """The file's blocks [N, K/32 * block bytes] -> (qs, d, m): qs int8 [N, K] (Q8_0) or the
    nibbles uint8 [N, K/2]; m None for Q8_0."""
    size = {"Q4_0": 18, "Q4_1": 20, "Q8_0": 34}[type_name]
    nb = k // QK
    blocks = np.ascontiguousarray(raw, dtype=np.uint8).reshape(n, nb, size)
    d = blocks[:, :, 0:2].copy().view(np.float16).reshape(n, nb).astype(np.float32)
    if type_name == "Q8_0":  # one copy of the values (a reshape of the strided view is one)
        q = np.ascontiguousarray(blocks[:, :, 2:]).view(np.int8).reshape(n, k)
        return torch.from_numpy(q), torch.from_numpy(d), None
    if type_name == "Q4_1":
        m = blocks[:, :, 2:4].copy().view(np.float16).reshape(n, nb).astype(np.float32)
    else:  # Q4_0
        m = -8.0 * d
    qs = np.ascontiguousarray(blocks[:, :, size - 16 :]).reshape(n, nb * 16)
    return torch.from_numpy(qs), torch.from_numpy(d), torch.from_numpy(m)


def pack(
    qs: torch.Tensor, d: torch.Tensor, m: torch.Tensor | None, eight_bit: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(qs uint8 [groups, nb * bytes], d float16 [groups, nb, 16], m like d or None): each
    group's blocks with the 16 rows' bytes interleaved 4 at a time; 8-bit values stored +
    128 (unsigned)."""
    n, nb = qs.shape[0], d.shape[1]
    g = groups(n)
    # q8's + 128 as one XOR over the packed words (the zero rows of padding: 0x80 too)
    out = words(qs, g * GROUP_ROWS).view(g, GROUP_ROWS, nb, -1).permute(0, 2, 3, 1).contiguous()
    if eight_bit:
        out ^= _BIAS_WORD
    return out.view(torch.uint8).view(g, -1), pack_scales(d), None if m is None else pack_scales(m)


_BIAS_WORD = int(np.array([0x80808080], np.uint32).view(np.int32)[0])  # 128 in every byte
