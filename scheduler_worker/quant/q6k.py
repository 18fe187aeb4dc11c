"""GGUF Q6_K weights for the C++ kernels (qlinear fmt 5, csrc/qgemm_q6k.h), kept as the
file has them: per row and super-block of 256 inputs, 208 bytes of 4-bit and 2-bit planes
and int8 sub-scales (qs), and the float16 super-scale (d): 210 bytes per 256 weights,
exactly the file's size. formats.py routes GGUF's Q6_K here as the form "q6k": a BlockWeight
holds qs as the kernel takes it and d widened to float32 (exact); the kernel's layout is
the file's rows, unpadded (`pack`).

Per 16 inputs ("piece") w = d * scale * (q - 32), q in 0..63 (see csrc/qgemm_q6k.h for the
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
    the kernel's qs [n, k / 256 * 208] uint8 and d [n, k / 256] float16."""
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


def pieces(qs: torch.Tensor, d: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """qs uint8 [N, K/256 * 208], d float32 [N, K/256] -> (q - 32 int32 [N, K/16, 16],
    d * scale float32 [N, K/16]): w = (d * scale) * (q - 32), as gguf-py computes it."""
    n = qs.shape[0]
    b = qs.reshape(n, -1, PLANE_BYTES)
    nb = b.shape[1]
    ql = b[..., :128].to(torch.int32).view(n, nb, 2, 1, 2, 32)  # [.., h, nibble, r & 1, l]
    qh = b[..., 128:192].to(torch.int32).view(n, nb, 2, 1, 32)  # [.., h, l]
    lo = (ql >> torch.tensor([0, 4]).view(2, 1, 1)) & 15  # r = 2 * nibble + (r & 1)
    lo = lo.reshape(n, nb, 2, 4, 32)
    hi = (qh >> (2 * torch.arange(4)).view(4, 1)) & 3  # [.., h, r, l]
    q = (lo | (hi << 4)) - 32  # input 128 h + 32 r + l
    sc = b[..., 192:].contiguous().view(torch.int8).reshape(n, nb, 16).float()
    dw = (d.float()[..., None] * sc).reshape(n, nb * 16)
    return q.reshape(n, nb * 16, PIECE), dw


def pack(qs: torch.Tensor, d: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None]:
    """The kernel's (qs, d float16, no m): the file's rows as they are."""
    half = d.half()
    if not torch.equal(half.float(), d.float()):
        raise ValueError("Q6_K super-scales must be float16 values (the GGUF file's)")
    return qs.contiguous(), half.contiguous(), None


def q6k_linear(
    x: torch.Tensor, qs: torch.Tensor, d: torch.Tensor, n: int, isa: int
) -> torch.Tensor:
    """x [M, K] @ W.T with W the Q6_K weight (split_q6k), on kernel path `isa`."""
    return torch.ops.zeroserve.qlinear(x, qs, d, None, Q6K_FMT, n, isa)
