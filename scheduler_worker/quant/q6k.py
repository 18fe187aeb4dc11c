"""GGUF Q6_K weights for the C++ kernels (qlinear fmt 5, csrc/qgemm_q6k.h), kept as the
file has them: per row and super-block of 256 inputs, 208 bytes of 4-bit and 2-bit planes
and int8 sub-scales (qs), and the float16 super-scale (d): 210 bytes per 256 weights,
exactly the file's size.
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
    t = torch.as_tensor(np.ascontiguousarray(raw)).view(torch.uint8)
    if t.numel() != n * nb * BLOCK_BYTES:
        raise ValueError(f"Q6_K [{n}, {k}] needs {n * nb * BLOCK_BYTES} bytes, got {t.numel()}")
    blocks = t.reshape(n, nb, BLOCK_BYTES)
    qs = blocks[:, :, :PLANE_BYTES].reshape(n, nb * PLANE_BYTES).contiguous()
    d = blocks[:, :, PLANE_BYTES:].contiguous().view(torch.float16).reshape(n, nb)
    return qs, d


def q6k_linear(
    x: torch.Tensor, qs: torch.Tensor, d: torch.Tensor, n: int, isa: int
) -> torch.Tensor:
    """x [M, K] @ W.T with W the Q6_K weight (split_q6k), on kernel path `isa`."""
    return torch.ops.zeroserve.qlinear(x, qs, d, None, Q6K_FMT, n, isa)
