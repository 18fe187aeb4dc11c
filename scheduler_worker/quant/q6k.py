"""GGUF Q6_K weights for the C++ kernels (csrc/quant/formats.h): the form "q6k" of
formats.py's table: a BlockWeight holds the file's rows as they are,
per row and super-block of 256 inputs 208 bytes of 4-bit and 2-bit planes and int8
sub-scales (qs) and the super-scale (d, widened to float32: exact). `pack` moves those bits
into the kernels' layout, 16 output rows interleaved (the layout of the other formats,
quant/formats.h; the last group padded with zero scales): only bits move,
no value changes, and the packed tensors are the file's 210 bytes per 256 weights (plus
the padding of the last group of 16 rows).

Per 16 inputs ("piece") w = d * scale * (q - 32), q in 0..63 (see `values` for the file's
bit positions): `pieces` gives the q - 32 and the float32 d * scale of every piece, the
oracle's view of the weight.
"""

from __future__ import annotations

import numpy as np
import torch

from scheduler_worker.quant.groups import GROUP_ROWS as GR
from scheduler_worker.quant.groups import groups, pack_scales, words

QK_K = 256
BLOCK_BYTES = 210  # ql 128 | qh 64 | scales 16 | d 2
PLANE_BYTES = 208


def split_q6k(raw: np.ndarray | torch.Tensor, n: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The GGUF tensor's bytes ([n, k / 256 * 210] uint8, as gguf-py reads them) split into
    a BlockWeight's qs [n, k / 256 * 208] uint8 (the file's planes and sub-scales) and d
    [n, k / 256] float16 (`pack` makes the kernels' layout of them)."""
    if k % QK_K:
        raise ValueError(f"Q6_K rows hold whole super-blocks of {QK_K}, got {k} inputs")
    nb = k // QK_K
    a = raw.numpy() if isinstance(raw, torch.Tensor) else raw
    a = np.ascontiguousarray(a).view(np.uint8)  # (a view of a file's memory map stays one)
    if a.size != n * nb * BLOCK_BYTES:
        raise ValueError(f"Q6_K [{n}, {k}] needs {n * nb * BLOCK_BYTES} bytes, got {a.size}")
    blocks = a.reshape(n, nb, BLOCK_BYTES)
    qs = np.ascontiguousarray(blocks[:, :, :PLANE_BYTES]).reshape(n, nb * PLANE_BYTES)
    d = np.ascontiguousarray(blocks[:, :, PLANE_BYTES:]).view(np.float16).reshape(n, nb)
    return torch.from_numpy(qs), torch.from_numpy(d)


PIECE = 16  # inputs per int8 sub-scale


def values(qs: torch.Tensor) -> torch.Tensor:
    """qs uint8 [N, K/256 * 208] (the file's planes) -> q uint8 [N, K] in 0..63. Input
    128 h + 32 r + l (h < 2, r < 4, l < 32) of a super-block takes its low 4 bits from
    ql[64 h + 32 (r & 1) + l] (the low nibble for r < 2, else the high one) and its top 2
    from qh[32 h + l] >> 2 r."""
    n = qs.shape[0]
    b = qs.reshape(n, -1, PLANE_BYTES)
    nb = b.shape[1]
    ql = b[..., :128].reshape(n, nb, 2, 1, 2, 32)  # [.., h, nibble, r & 1, l]
    qh = b[..., 128:192].reshape(n, nb, 2, 1, 32)  # [.., h, l]
    lo = (ql >> torch.tensor([0, 4], dtype=torch.uint8).view(2, 1, 1)) & 15
    hi = (qh >> (2 * torch.arange(4, dtype=torch.uint8)).view(4, 1)) & 3  # [.., h, r, l]
    return (lo.reshape(n, nb, 2, 4, 32) | (hi << 4)).reshape(n, nb * QK_K)


def pieces(qs: torch.Tensor, d: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """qs uint8 [N, K/256 * 208], d float32 [N, K/256] -> (q - 32 int32 [N, K/16, 16],
    d * scale float32 [N, K/16]): w = (d * scale) * (q - 32), as gguf-py computes it."""
    n = qs.shape[0]
    q = values(qs).to(torch.int32) - 32
    sc = qs.reshape(n, -1, PLANE_BYTES)[..., 192:].contiguous().view(torch.int8).float()
    dw = (d.float()[..., None] * sc).reshape(n, -1)
    return q.reshape(n, -1, PIECE), dw


SUB_BYTES = 384  # per group and sub-block of 32 inputs: nibble plane 256, top bits 2 x 64
SUB_WORDS = SUB_BYTES // 4
GROUP_BYTES = 256 + 8 * SUB_BYTES  # per group and super-block: sub-scales, 8 sub-blocks


def pack(qs: torch.Tensor, d: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None]:
    """The kernels' layout (csrc/quant/formats.h): (qs uint8 [groups, K/256 * 3328], d float16
    [groups, K/256, 16], no m). Sub-block 4 h + r of a super-block (inputs 128 h + 32 r +
    l) holds, 16 rows side by side per word: register k = the low 4 bits of inputs 4k + j
    (low nibble) and 16 + 4k + j (high) for j < 4, the ql bytes' nibble r >= 2; then per
    piece p of 16 inputs, bits 2k..2k+1 of byte j = the top 2 bits of input 16 p + 4 k + j,
    bits 2r..2r+1 of qh. Made from int32 words of the file's rows, without unpacking."""
    n, nsb = d.shape
    g = groups(n)
    w = words(qs, g * GR).view(g, GR, nsb, PLANE_BYTES // 4)
    ql = w[..., :32].view(g, GR, nsb, 2, 2, 8)  # [.., h, r & 1, word of l]
    qh = w[..., 32:48].view(g, GR, nsb, 2, 2, 4)  # [.., h, piece, k]
    out = torch.empty(g, nsb, 64 + 8 * SUB_WORDS, dtype=torch.int32)
    head = out[..., :64].view(torch.uint8).view(g, nsb, 16, GR)  # [piece scale, row]
    head.copy_(w[..., 48:].view(torch.uint8).view(g, GR, nsb, 16).permute(0, 2, 3, 1))
    subs = out[..., 64:].view(g, nsb, 2, 4, SUB_WORDS)  # [.., h, r, word]
    for r in range(4):
        x = (ql[..., r & 1, :] >> (4 * (r // 2))) & 0x0F0F0F0F  # [g, row, nsb, h, 8]
        nib = x[..., :4] | (x[..., 4:] << 4)  # [g, row, nsb, h, k]
        subs[:, :, :, r, :64].view(g, nsb, 2, 4, GR).copy_(nib.permute(0, 2, 3, 4, 1))
        t = (qh >> (2 * r)) & 0x03030303  # [g, row, nsb, h, piece, k]
        top = t[..., 0] | (t[..., 1] << 2) | (t[..., 2] << 4) | (t[..., 3] << 6)
        subs[:, :, :, r, 64:].view(g, nsb, 2, 2, GR).copy_(top.permute(0, 2, 3, 4, 1))
    packed = out.view(torch.uint8).view(g, -1)
    return packed, pack_scales(d, "Q6_K super-scales"), None
