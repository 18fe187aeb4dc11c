"""The paged KV pool's memory on the CPU: one (key, value) pair of tensors per layer, all zeros.

    layer i ─▶ (K [num_blocks + 1, block_size, num_kv_heads, head_dim],
                V [same shape])

Zeros, not garbage: a block's slots past a sequence's length, and the scratch block, may
be read under a mask (a softmax weight of 0 times a NaN would still poison the sum).

On the CPU each tensor lies in its own anonymous memory map: the kernel hands out zero
pages on first touch, so the pool costs nothing until the engine writes into it. A
`torch.zeros` of the same size writes every page at start (Gemma 3's one sequence of
32,768 tokens is a 1.12 GiB pool: a second or more of start-up on a small machine, and
all of it resident though a short request touches a few blocks).
"""

from __future__ import annotations

import math
import mmap

import torch

KVCache = tuple[torch.Tensor, torch.Tensor]


def zero_pages(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A CPU tensor of zeros backed by an anonymous map (zero-filled by the OS, touched
    only where written). The tensor keeps the map alive."""
    nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    if nbytes == 0:
        return torch.zeros(shape, dtype=dtype)
    buf = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    return torch.frombuffer(buf, dtype=dtype).view(shape)


def allocate_kv_pool(num_layers: int, shape: tuple[int, ...], dtype: torch.dtype) -> list[KVCache]:
    """Per layer, a zeroed (key, value) pair of `shape` in host memory (CpuBackend's pool;
    a GPU's is CudaBackend's own)."""
    return [(zero_pages(shape, dtype), zero_pages(shape, dtype)) for _ in range(num_layers)]
