"""GGUF Q6_K weights for the C++ kernels (qlinear fmt 5, csrc/qgemm_q6k.h). formats.py
routes GGUF's Q6_K here as the form "q6k": a BlockWeight holds the file's rows as they are,
per row and super-block of 256 inputs 208 bytes of 4-bit and 2-bit planes and int8
sub-scales (qs) and the super-scale (d, widened to float32: exact). `pack` moves those bits
into the kernels' layout, 16 output rows interleaved (the layout of the other formats,
qgemm_common.h / qgemm_kquant.h; the last group padded with zero scales): only bits move,
no value changes, and the packed tensors are the file's 210 bytes per 256 weights (plus
the padding of the last group of 16 rows).

Per 16 inputs ("piece") w = d * scale * (q - 32), q in 0..63 (see `values` for the file's
bit positions): `pieces` gives the q - 32 and the float32 d * scale of every piece, the
oracle's view of the weight.
"""

from __future__ import annotations

import numpy as np
import torch

Q6K_FMT = 5  # qlinear's format code
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


GR = 16  # output rows per group of the kernels' layout
SUB_BYTES = 384  # per group and sub-block of 32 inputs: nibble plane 256, top bits 2 x 64
GROUP_BYTES = 256 + 8 * SUB_BYTES  # per group and super-block: sub-scales, 8 sub-blocks


def packed_nbytes(n: int, k: int) -> int:
    """Bytes of `pack`'s tensors for an [n, k] weight: 210 per 16 rows and 256 inputs."""
    return -(-n // GR) * (k // QK_K) * (GROUP_BYTES + 2 * GR)


def pack(qs: torch.Tensor, d: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None]:
    """The kernels' layout (csrc/qgemm_q6k.h): (qs uint8 [groups, K/256 * 3328], d float16
    [groups, K/256, 16], no m)."""
    half = d.half()
    if not torch.equal(half.float(), d.float()):
        raise ValueError("Q6_K super-scales must be float16 values (the GGUF file's)")
    n, nsb = d.shape
    g = -(-n // GR)
    pad = g * GR - n

    def rows(t: torch.Tensor) -> torch.Tensor:  # padded to whole groups with zeros
        return torch.cat([t, torch.zeros(pad, *t.shape[1:], dtype=t.dtype)])

    q = rows(values(qs)).view(g, GR, nsb * 8, 2, 4, 4)  # [.., sub-block, piece, k, j]
    lo = q & 15
    nib = lo[:, :, :, 0] | (lo[:, :, :, 1] << 4)  # [g, row, sub-block, k, j]
    nib = nib.permute(0, 2, 3, 1, 4).reshape(g, nsb * 8, 256)
    shift = (2 * torch.arange(4, dtype=torch.uint8)).view(4, 1)
    top = ((q >> 4) << shift).sum(4, dtype=torch.uint8)  # [g, row, sub-block, piece, j]
    top = top.permute(0, 2, 3, 1, 4).reshape(g, nsb * 8, 128)
    sub = torch.cat([nib, top], dim=-1).view(g, nsb, 8 * SUB_BYTES)
    sc = rows(qs.reshape(n, nsb, PLANE_BYTES)[..., 192:])  # [row, super-block, piece]
    sc = sc.view(g, GR, nsb, 16).permute(0, 2, 3, 1).reshape(g, nsb, 256)
    packed = torch.cat([sc, sub], dim=-1).reshape(g, -1).contiguous()
    return packed, rows(half).view(g, GR, nsb).transpose(1, 2).contiguous(), None


def q6k_linear(
    x: torch.Tensor, qs: torch.Tensor, d: torch.Tensor, n: int, isa: int
) -> torch.Tensor:
    """x [M, K] @ W.T with W the Q6_K weight in the kernels' layout (`pack`), on kernel
    path `isa`."""
    return torch.ops.zeroserve.qlinear(x, qs, d, None, Q6K_FMT, n, isa)
