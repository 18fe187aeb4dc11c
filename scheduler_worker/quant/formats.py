"""Block-quantized weights: GGUF's Q4_0 / Q4_1 / Q8_0 as the kernels take them, and the
pure-torch oracle the kernels are tested against.

A weight [N, K] is cut into blocks of 32 along K (the input dim). Two kernel forms cover
the three GGUF formats, values unchanged:

    form "q4":  w = d * q + m,  q in 0..15 (two per byte, GGUF's nibble order)
                Q4_1 as stored (d, m); Q4_0 is q4 with m = -8 d.
    form "q8":  w = d * q,      q in -127..127 (int8)
                Q8_0 as stored.

GGUF keeps d and m as float16 inside each block; a BlockWeight holds them widened to
float32 arrays [N, K/32] (exact), and the kernels' layout (`pack_blocks`) narrows them back
to float16, interleaved with the nibbles 16 rows at a time. Float checkpoints are
quantized into the same forms, scales rounded to float16 as GGUF's are (`quantize_q4`:
Q4_1's recipe, min/max per block; `quantize_q8`: Q8_0's, absmax per block).

GGUF's Q5_0, Q5_1, Q4_K and Q5_K take the forms "q50", "q5", "q4k", "q5k" of kquants.py (their
arrays, layout and math there); from_gguf, dequantize, pack_blocks, cat_rows and
reference_qlinear serve every form, so a loader needs only GGUF_BLOCK_TYPES and these.
GGUF's Q6_K takes the form "q6k" of q6k.py: the file's bytes as they are (qs: the 208
bytes of planes and int8 sub-scales per 256 inputs, d: the super-scale), scaled per 16
inputs rather than 32, repacked 16 rows at a time by q6k.pack.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from scheduler_worker.quant import kquants, q6k
from scheduler_worker.quant.groups import GROUP_ROWS, groups, pack_scales, words

QK = 32  # inputs per block
FORMS = ("q4", "q8", *kquants.K_FORMS, "q6k")
FMT_CODES = {
    "q4": 0,
    "q8": 1,
    **kquants.FMT_CODES,
    "q6k": q6k.Q6K_FMT,
}  # the qlinear op's fmt per form
# forms whose steps the "amx" kernel path runs on the tile unit (csrc/quant/arch/amx/amx.h: the 8-bit
# format from 16 rows, the 5-bit ones from 32); the others run their AVX-512 VNNI tiles there
AMX_FORMS = ("q8", "q5", "q50", "q5k")


def kernel_label(form: str, isa: str) -> str:
    """What serves a weight of `form` on kernel path `isa`, for the load log."""
    label = f"qlinear {form} {isa}"
    return (
        label
        if isa != "amx" or form in AMX_FORMS
        else f"{label} (VNNI tiles: no AMX path for {form})"
    )


# GGUF type name -> (kernel form, bytes per block: of 32 inputs, of 256 for the K-quants)
GGUF_BLOCK_TYPES = {
    "Q4_0": ("q4", 18),
    "Q4_1": ("q4", 20),
    "Q8_0": ("q8", 34),
    **kquants.K_TYPES,
    "Q6_K": ("q6k", q6k.BLOCK_BYTES),
}


@dataclass
class BlockWeight:
    form: str  # one of FORMS
    qs: torch.Tensor  # q8: int8 [N, K]; q6k: uint8 [N, K/256 * 208]; the others uint8 [N, K/2]
    d: torch.Tensor  # float32 [N, K/32] (K-quant forms and q6k: [N, K/256])
    m: torch.Tensor | None  # like d; q8, q6k: None
    source: str  # what it was made from: "Q4_1", "Q8_0", "int4", ...
    qh: torch.Tensor | None = None  # 5-bit forms (kquants.py)
    sc: torch.Tensor | None = None  # K-quant forms: sub-block scales (kquants.py)
    mn: torch.Tensor | None = None  # K-quant forms: sub-block mins

    @property
    def shape(self) -> tuple[int, int]:
        if self.form == "q6k":
            return self.qs.shape[0], self.qs.shape[1] // q6k.PLANE_BYTES * q6k.QK_K
        return self.qs.shape[0], self.qs.shape[1] * (1 if self.form == "q8" else 2)

    def nbytes(self) -> int:
        """Bytes of the kernels' layout (pack_blocks), the memory a served weight takes."""
        n, k = self.shape
        if self.form == "q6k":
            return q6k.packed_nbytes(n, k)
        if self.form in kquants.K_FORMS:
            return kquants.packed_nbytes(self.form, n, k)
        per_block = 512 + 2 * GROUP_ROWS if self.form == "q8" else 256 + 4 * GROUP_ROWS
        return groups(n) * (k // QK) * per_block


def from_gguf(raw: np.ndarray, type_name: str, n: int, k: int) -> BlockWeight:
    """Split GGUF blocks ([N, K/32 * block bytes] uint8, rows in the file's order) into the
    kernel arrays. Every value is kept: d, m are widened float16 -> float32."""
    if type_name not in GGUF_BLOCK_TYPES:
        raise ValueError(
            f"GGUF type {type_name} has no kernel (supported: {', '.join(GGUF_BLOCK_TYPES)})"
        )
    form, size = GGUF_BLOCK_TYPES[type_name]
    if form == "q6k":
        planes, d6 = q6k.split_q6k(raw, n, k)
        return BlockWeight(form, planes, d6.float(), None, type_name)
    if form in kquants.K_FORMS:
        p = kquants.split_gguf(raw, type_name, n, k)

        def opt(a: np.ndarray | None) -> torch.Tensor | None:
            return None if a is None else torch.from_numpy(a)

        t = torch.from_numpy
        return BlockWeight(
            form, t(p.qs), t(p.d), t(p.m), type_name, opt(p.qh), opt(p.sc), opt(p.mn)
        )
    if k % QK:
        raise ValueError(f"{type_name} needs the input dim ({k}) to be a multiple of {QK}")
    nb = k // QK
    blocks = np.ascontiguousarray(raw, dtype=np.uint8).reshape(n, nb, size)
    d = blocks[:, :, 0:2].copy().view(np.float16).reshape(n, nb).astype(np.float32)
    if type_name == "Q8_0":  # one copy of the values (a reshape of the strided view is one)
        q = np.ascontiguousarray(blocks[:, :, 2:]).view(np.int8).reshape(n, k)
        return BlockWeight("q8", torch.from_numpy(q), torch.from_numpy(d), None, type_name)
    if type_name == "Q4_1":
        m = blocks[:, :, 2:4].copy().view(np.float16).reshape(n, nb).astype(np.float32)
    else:  # Q4_0
        m = -8.0 * d
    qs = np.ascontiguousarray(blocks[:, :, size - 16 :]).reshape(n, nb * 16)
    return BlockWeight(
        form, torch.from_numpy(qs), torch.from_numpy(d), torch.from_numpy(m), type_name
    )


def _blocks(w: torch.Tensor) -> torch.Tensor:
    n, k = w.shape
    if k % QK:
        raise ValueError(f"block quantization needs the input dim ({k}) to be a multiple of {QK}")
    return w.detach().float().reshape(n, k // QK, QK)


def pack_nibbles(q: torch.Tensor) -> torch.Tensor:
    """q [N, nb, 32] in 0..15 -> uint8 [N, nb*16]: byte j = q[j] | q[j+16] << 4 (GGUF's order)."""
    q = q.to(torch.uint8)
    return (q[..., :16] | (q[..., 16:] << 4)).reshape(q.shape[0], -1).contiguous()


def unpack_nibbles(qs: torch.Tensor) -> torch.Tensor:
    """uint8 [N, nb*16] -> int32 [N, nb, 32] in 0..15."""
    b = qs.reshape(qs.shape[0], -1, 16).to(torch.int32)
    return torch.cat([b & 15, b >> 4], dim=-1)


def _half(t: torch.Tensor) -> torch.Tensor:
    """Rounded to float16 as GGUF stores scales (kept in float32 arrays here)."""
    return t.half().float().contiguous()


def quantize_q4(w: torch.Tensor) -> BlockWeight:
    """Q4_1's recipe: per block of 32, d = (max - min) / 15, m = min, q = round((w - m) / d),
    d and m stored as float16 (as llama.cpp's quantize_row_q4_1 does)."""
    g = _blocks(w)
    lo, hi = g.amin(dim=2), g.amax(dim=2)
    d = (hi - lo) / 15.0
    inv = torch.where(d > 0, 1.0 / d, torch.zeros_like(d))
    q = torch.round((g - lo[..., None]) * inv[..., None]).clamp(0, 15)
    return BlockWeight("q4", pack_nibbles(q), _half(d), _half(lo), "int4")


def _q8(g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Blocks [N, nb, 32] -> (q int8 [N, nb*32], d float32 [N, nb]): d = absmax / 127."""
    d = g.abs().amax(dim=2) / 127.0
    inv = torch.where(d > 0, 1.0 / d, torch.zeros_like(d))
    q = torch.round(g * inv[..., None]).clamp(-127, 127).to(torch.int8)
    return q.reshape(g.shape[0], -1).contiguous(), d.contiguous()


def quantize_q8(w: torch.Tensor) -> BlockWeight:
    """Q8_0's recipe: per block of 32, d = absmax / 127, q = round(w / d), d stored as
    float16 (as llama.cpp's quantize_row_q8_0 does)."""
    q, d = _q8(_blocks(w))
    return BlockWeight("q8", q, _half(d), None, "int8")


def block_values(bw: BlockWeight) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(q int32 [N, K/P, P], dw [N, K/P], mw like dw or None): w = dw * q + mw per piece of
    P inputs: P = 32 (a block), 16 for q6k (one sub-scale each)."""
    n = bw.shape[0]
    if bw.form == "q6k":
        q, dw = q6k.pieces(bw.qs, bw.d)
        return q, dw, None
    if bw.form == "q8":
        return bw.qs.reshape(n, -1, QK).to(torch.int32), bw.d, None
    assert bw.m is not None
    if bw.form == "q4":
        return unpack_nibbles(bw.qs), bw.d, bw.m
    dw, mw = kquants.block_scales(bw.form, bw.d, bw.m, bw.sc, bw.mn)
    return kquants.values(bw.qs, bw.qh), dw, mw


def dequantize(bw: BlockWeight) -> torch.Tensor:
    """The float32 weight [N, K] the blocks stand for (the oracle's and the fallback's);
    for GGUF blocks bit for bit what gguf-py's dequantize gives."""
    q, dw, mw = block_values(bw)
    w = q.float() * dw[..., None]
    if mw is not None:
        w = w + mw[..., None]
    return w.reshape(bw.shape)


def cat_rows(parts: list[BlockWeight]) -> BlockWeight:
    """Stack weights along N (q/k/v into qkv): they must share a form and K."""
    forms = {p.form for p in parts}  # (K-quant forms need K % 256 == 0: same units)
    if len(forms) != 1 or len({p.shape[1] for p in parts}) != 1:
        raise ValueError(
            f"cannot stack block weights of forms {sorted(forms)} and shapes "
            f"{[p.shape for p in parts]}"
        )
    ms = [p.m for p in parts]
    m = None if any(x is None for x in ms) else torch.cat([x for x in ms if x is not None])

    def extra(name: str) -> torch.Tensor | None:
        ts = [getattr(p, name) for p in parts]
        return None if ts[0] is None else torch.cat(ts)

    return BlockWeight(
        parts[0].form,
        torch.cat([p.qs for p in parts]),
        torch.cat([p.d for p in parts]),
        m,
        "+".join(sorted({p.source for p in parts})),
        extra("qh"),
        extra("sc"),
        extra("mn"),
    )


def quantize_activations(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """What the kernels do to activations (llama.cpp's Q8_1: Q8_0's recipe plus block sums):
    returns (q int8 [M, K], d [M, K/32], s = d * sum(q) [M, K/32])."""
    q, d = _q8(_blocks(x))
    return q, d, d * q.reshape(*d.shape, QK).sum(dim=2).float()


def reference_qlinear(x: torch.Tensor, bw: BlockWeight) -> torch.Tensor:
    """The kernels' arithmetic in float64 torch (8-bit activations, integer block dots):
    what qlinear must return up to float32 rounding."""
    xq, xd, xs = quantize_activations(x)
    wq, dw, mw = block_values(bw)
    piece = wq.shape[-1]  # 32, or 16: each activation block's d serves 32 // piece pieces
    xb = xq.reshape(x.shape[0], -1, piece).double()
    xd = xd.repeat_interleave(QK // piece, dim=1)
    dots = torch.einsum("mbk,nbk->mnb", xb, wq.double())  # integer-valued
    out = (dots * xd.double()[:, None, :] * dw.double()[None]).sum(-1)
    if mw is not None:
        out += xs.double() @ mw.double().T
    return out


def pack_blocks(w: BlockWeight) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """The C++ kernels' layout (scheduler_worker/kernels/csrc/quant/formats.h): rows in
    groups of 16 (the last one padded with zero weights), each group's blocks with the 16
    rows' bytes interleaved 4 at a time; 8-bit values stored + 128 (unsigned); d and m as
    float16 (every value is one: they come from GGUF's float16 fields or are rounded so by
    quantize_q4/q8). Returns (qs uint8 [groups, nb * bytes], d float16 [groups, nb, 16],
    m like d or None). The 5-bit and K-quant forms: kquants.pack (csrc/quant/formats.h); Q6_K:
    q6k.pack (csrc/quant/formats.h)."""
    if w.form == "q6k":
        return q6k.pack(w.qs, w.d)
    if w.form in kquants.K_FORMS:
        assert w.m is not None
        return kquants.pack(w.form, w.qs, w.qh, w.d, w.m, w.sc, w.mn)
    n, k = w.shape
    nb, g = k // QK, groups(n)
    # q8's + 128 as one XOR over the packed words (the zero rows of padding: 0x80 too)
    qs = words(w.qs, g * GROUP_ROWS).view(g, GROUP_ROWS, nb, -1).permute(0, 2, 3, 1).contiguous()
    if w.form == "q8":
        qs ^= _BIAS_WORD
    m = None if w.m is None else pack_scales(w.m)
    return qs.view(torch.uint8).view(g, -1), pack_scales(w.d), m


_BIAS_WORD = int(np.array([0x80808080], np.uint32).view(np.int32)[0])  # 128 in every byte
