"""GGUF's 5-bit and K-quant formats (Q5_0, Q5_1, Q4_K, Q5_K) for the C++ kernels: split
from the file's blocks, stood for as float (the oracle), and repacked for the kernels
(layout: scheduler_worker/kernels/csrc/quant/formats.h); formats.py's table names them.

Every format is, per block of 32 inputs (a K-quant "sub-block"), w = dw * q + mw with q an
unsigned integer; only bits are moved, no value changes:

    form "q5"  (Q5_1): q in 0..31, dw = d, mw = m float16 per block
    form "q50" (Q5_0): Q5_1's layout, m = -16 d (Q5_0 stores q - 16; exact in
               float16): the kernels store no m and subtract 16 s in one FMA
    form "q4k" (Q4_K): q in 0..15 \\  super-blocks of 256 inputs: d, dmin float16,
    form "q5k" (Q5_K): q in 0..31 /  and per sub-block 6-bit scale sc and min mn;
               dw = d * sc, mw = -dmin * mn (formed in float32 by the kernel: exact)

The arrays of a BlockWeight of these forms (rows in the file's order):
    qs  uint8 [N, K/2]    4 low bits, per block of 32 in Q4_0's order (byte j: input j in
                          the low nibble, input 16 + j in the high one)
    qh  uint8 [N, K/8]    5-bit forms: the fifth bits, bit i of a block's 4 bytes
                          (little-endian) = input i (Q5_0's own qh)
    d, m float32          q5, q50: [N, K/32] (d, m); K forms: [N, K/256] (d, -dmin); float16
    sc, mn uint8 [N, K/32] K forms: the 6-bit sub-block scales and mins
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

from scheduler_worker.quant.groups import GROUP_ROWS as GR
from scheduler_worker.quant.groups import groups, pack_scales, pad_rows, words

QK, QK_K = 32, 256
SUB_BYTES_HI = 320  # per group and sub-block of the 5-bit forms: nibbles 256, fifth bits 64


def _f16(b: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(b).view(np.float16)[..., 0].astype(np.float32)


def scale_min_k4(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The 12 scale bytes of a Q4_K / Q5_K super-block [..., 12] -> (sc, mn) [..., 8] uint8:
    sub-blocks 0-3 keep the low 6 bits of bytes 0-3 (scales) and 4-7 (mins); 4-7 take their
    low 4 bits from the nibbles of bytes 8-11 and the top 2 from the spare bits of 0-7."""
    a, b, c = scales[..., 0:4], scales[..., 4:8], scales[..., 8:12]
    sc = np.concatenate([a & 63, (c & 15) | ((a >> 2) & 0x30)], axis=-1)
    mn = np.concatenate([b & 63, (c >> 4) | ((b >> 2) & 0x30)], axis=-1)
    return sc, mn


def _nibbles(q: np.ndarray) -> np.ndarray:
    """q [N, nb, 32] -> uint8 [N, nb*16] in Q4_0's order, low 4 bits."""
    q = q & 15
    return (q[..., :16] | (q[..., 16:] << 4)).reshape(q.shape[0], -1)


def _high_bits(q: np.ndarray) -> np.ndarray:
    """q [N, nb, 32] in 0..31 -> uint8 [N, nb*4]: bit i of a block's 4 bytes = q[i] >> 4."""
    return np.packbits((q >> 4) & 1, axis=-1, bitorder="little").reshape(q.shape[0], -1)


class Parts(NamedTuple):
    """The arrays of the module docstring, in numpy."""

    qs: np.ndarray
    qh: np.ndarray | None
    d: np.ndarray
    m: np.ndarray
    sc: np.ndarray | None
    mn: np.ndarray | None


def split_q5(raw: np.ndarray, type_name: str, n: int, k: int) -> Parts:
    """Q5_0 / Q5_1 blocks [N, K/32 * 22 or 24] -> the arrays of the module docstring."""
    size, off = (24, 4) if type_name == "Q5_1" else (22, 2)
    blocks = np.ascontiguousarray(raw, dtype=np.uint8).reshape(n, k // QK, size)
    d = _f16(blocks[..., 0:2])
    m = _f16(blocks[..., 2:4]) if type_name == "Q5_1" else -16.0 * d
    qs = np.ascontiguousarray(blocks[..., off + 4 :]).reshape(n, k // 2)
    qh = np.ascontiguousarray(blocks[..., off : off + 4]).reshape(n, k // 8)
    return Parts(qs, qh, d, m, None, None)


def split_k(raw: np.ndarray, type_name: str, n: int, k: int) -> Parts:
    """Q4_K / Q5_K super-blocks [N, K/256 * 144 or 176] -> the arrays of the module docstring."""
    five = type_name == "Q5_K"
    nu = k // QK_K
    blocks = np.ascontiguousarray(raw, dtype=np.uint8).reshape(n, nu, 176 if five else 144)
    d = _f16(blocks[..., 0:2])
    m = -_f16(blocks[..., 2:4])  # -dmin
    sc, mn = scale_min_k4(blocks[..., 4:16])
    # 4 chunks of 64 inputs, 32 bytes each: low nibbles sub-block 2c, high ones 2c + 1
    ql = blocks[..., -128:].reshape(n, nu, 4, 1, 32) >> np.array([0, 4], np.uint8).reshape(2, 1)
    q = (ql & 15).reshape(n, nu * 8, 32)
    if five:  # the fifth bit of sub-block t, input l: bit t of qh[l]
        qh = blocks[..., 16:48].reshape(n, nu, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(8, 1)
        q = q | ((qh & 1) << 4).reshape(n, nu * 8, 32)
    qh_out = _high_bits(q) if five else None
    sub = (sc.reshape(n, nu * 8).copy(), mn.reshape(n, nu * 8).copy())
    return Parts(_nibbles(q), qh_out, d, m, *sub)


def values(qs: torch.Tensor, qh: torch.Tensor | None) -> torch.Tensor:
    """qs [N, K/2] (+ qh [N, K/8]) -> q int32 [N, K/32, 32]."""
    b = qs.reshape(qs.shape[0], -1, 16).to(torch.int32)
    q = torch.cat([b & 15, b >> 4], dim=-1)
    if qh is not None:
        q = q | (_bits(qh).to(torch.int32) << 4)
    return q


def _bits(qh: torch.Tensor) -> torch.Tensor:
    """uint8 [N, K/8] -> uint8 [N, K/32, 32] of 0/1 (bit b of byte c: input 8c + b)."""
    shifts = torch.arange(8, dtype=torch.uint8)
    return ((qh.reshape(qh.shape[0], -1, 4, 1) >> shifts) & 1).reshape(qh.shape[0], -1, QK)


def block_scales(
    d: torch.Tensor, m: torch.Tensor, sc: torch.Tensor | None, mn: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(dw, mw) float32 [N, K/32]: w = dw * q + mw per block (exact products)."""
    if sc is None or mn is None:
        return d, m
    return (
        d.repeat_interleave(8, dim=1) * sc.float(),
        m.repeat_interleave(8, dim=1) * mn.float(),
    )


def pack(
    qs: torch.Tensor,
    qh: torch.Tensor | None,
    d: torch.Tensor,
    m: torch.Tensor | None,
    sc: torch.Tensor | None,
    mn: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """The kernels' layout (csrc/quant/formats.h) of nibbles (qs), fifth bits (qh, or None),
    per-block scale bytes of super-blocks (sc, and mn, uint8 [N, K/32]; None: blocks of 32):
    (qs uint8 [groups, bytes], d, m float16 [groups, units, 16]; m None where the kernels
    keep none). Built as int32 words: every piece of the layout is 4 bytes of one row."""
    n, nb = qs.shape[0], qs.shape[1] // 16
    g = groups(n)
    sbw = (SUB_BYTES_HI if qh is not None else 256) // 4  # words per group and sub-block
    # register k of a sub-block, word r = row r's nibble bytes 4k..4k+3
    nib = words(qs, g * GR).view(g, GR, nb, 4).permute(0, 2, 3, 1)
    hi = None
    if qh is not None:
        hi = _fifth_bit_words(words(qh, g * GR)).view(g, GR, nb).permute(0, 2, 1)
    if sc is not None:
        heads = [t for t in (sc, mn) if t is not None]  # [8 sub-blocks][16 rows] bytes each
        nu, hw = nb // 8, 32 * len(heads)
        out = torch.empty(g, nu, hw + 8 * sbw, dtype=torch.int32)
        head = out[..., :hw].view(torch.uint8).view(g, nu, len(heads), 8, GR)
        for i, t in enumerate(heads):
            head[:, :, i].copy_(pad_rows(t, g * GR).view(g, GR, nu, 8).permute(0, 2, 3, 1))
        subs = out[..., hw:].view(g, nu, 8, sbw)
    else:
        out = torch.empty(g, nb, sbw, dtype=torch.int32)
        subs = out.view(g, nb, 1, sbw)
    subs[..., :64].view(subs.shape[:3] + (4, GR)).copy_(nib.view(subs.shape[:3] + (4, GR)))
    if hi is not None:
        subs[..., 64:].copy_(hi.view(subs.shape[:3] + (GR,)))
    return out.view(torch.uint8).view(g, -1), pack_scales(d), None if m is None else pack_scales(m)


def _fifth_bit_words(h: torch.Tensor) -> torch.Tensor:
    """int32 [R, nb]: bit i = input i's fifth bit (the file's qh) -> the kernels' word:
    byte j holds, at bit 2k, input 4k + j's and at bit 2k + 1 input 16 + 4k + j's (the
    masks the VNNI tile tests for register k)."""
    h = h.to(torch.int64) & 0xFFFFFFFF
    out = torch.zeros_like(h)
    for j in range(4):
        x = h >> j  # input 4c + j now at bit 4c: the low half's register k = c for c < 4,
        # the high half's (input 16 + 4k + j) for c = 4 + k
        for half in range(2):
            t = (x >> (16 * half)) & 0x1111  # bits 0, 4, 8, 12
            t = (t | (t >> 2)) & 0x0505  # -> 0, 2, 8, 10
            t = (t | (t >> 4)) & 0x55  # -> 0, 2, 4, 6
            out |= t << (8 * j + half)
    return out.to(torch.int32)
