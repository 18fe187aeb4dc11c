"""Rows in groups of 16: what every form's kernel layout shares (formats.pack_blocks,
kquants.pack, q6k.pack). The kernels read 16 output rows at a time; a weight whose row
count is not a multiple of 16 is padded with rows of zero bits (zero weights for the
forms whose values are offset: the packers say how), and the float16 scales of a group
are stored 16 rows side by side per block."""

from __future__ import annotations

import torch

GROUP_ROWS = 16  # output rows per group of the kernels' layout


def groups(n: int) -> int:
    return -(-n // GROUP_ROWS)


def pad_rows(t: torch.Tensor, rows: int) -> torch.Tensor:
    """t with zero rows appended up to `rows` (t itself when it has them)."""
    if t.shape[0] == rows:
        return t
    return torch.cat([t, t.new_zeros(rows - t.shape[0], *t.shape[1:])])


def pack_scales(t: torch.Tensor, what: str = "block scales") -> torch.Tensor:
    """float32 [N, units] scales, each a float16 value (a GGUF field, or rounded so by the
    quantizers) -> float16 [groups, units, 16], the padding rows' scales 0."""
    half = t.half()
    if not torch.equal(half.float(), t.float()):
        raise ValueError(f"{what} must be float16 values (GGUF's, or quantize_q4/q8's)")
    g = groups(t.shape[0])
    return pad_rows(half, g * GROUP_ROWS).view(g, GROUP_ROWS, -1).transpose(1, 2).contiguous()


def words(t: torch.Tensor, rows: int) -> torch.Tensor:
    """uint8 / int8 [N, B] (B a multiple of 4) as int32 [rows, B / 4], zero rows appended:
    the layouts move bytes 4 at a time, and a permute of 4-byte words copies ~10x faster
    than one of bytes (start-up time)."""
    return pad_rows(t.contiguous().view(torch.int32), rows)
