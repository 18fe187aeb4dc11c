"""Block-quantized weights: the one table of the kernels' weight formats (FORMATS, a row
per form), the BlockWeight every form fills, and the pure-torch oracle the kernels are
tested against.

A weight [N, K] is cut into blocks of 32 along K (the input dim); per block (or piece of
16) w = dw * v + mw with v an integer (a row of csrc/quant/formats.h says how). A form's
row names its GGUF types, its qlinear code, its layout (as the C++ row has it: bits per
value, inputs per d, scale bytes per unit, a stored m) and its functions: `split` (the
file's blocks -> a BlockWeight), `values` (the oracle's v, dw, mw) and `pack` (the
kernels' layout). Their arrays and bit layouts live in the form's module:

    q4, q8             Q4_0 / Q4_1, Q8_0; and the int4 / int8 of float checkpoints   q4q8.py
    q5, q50, q4k, q5k  Q5_1, Q5_0, Q4_K, Q5_K                                        kquants.py
    q6k                Q6_K: the file's 208 bytes of planes and sub-scales            q6k.py
    iq4xs              IQ4_XS: nibbles into a 16-value codebook, int8 block scales    iq4xs.py
    iq4nl              IQ4_NL: the same codebook, a float16 d per block of 32         iq4nl.py

GGUF keeps d and m as float16; a BlockWeight holds them widened to float32 arrays (exact),
and `pack` narrows them back to float16, 16 rows side by side. Float checkpoints are
quantized into q4 / q8, scales rounded to float16 as GGUF's are (`quantize_q4`: Q4_1's
recipe, min/max per block; `quantize_q8`: Q8_0's, absmax per block).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from scheduler_worker.quant import iq4nl, iq4xs, kquants, q4q8, q6k
from scheduler_worker.quant.block_weight import LAYOUTS, BlockWeight
from scheduler_worker.quant.groups import GROUP_ROWS, groups

QK = 32  # inputs per block
Tensors = tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]


@dataclass(frozen=True)
class Format:
    """A row of the table: a kernel form (csrc/quant/formats.h FORMAT_ROWS[code])."""

    form: str
    code: int  # qlinear's fmt: the C++ row's index
    gguf: dict[str, int]  # the GGUF types it serves -> bytes per unit in the file
    bits: int  # per stored value (the C++ row's)
    unit: int  # inputs per d (and m): 32, or 256 (a super-block)
    head: int  # scale bytes per group of 16 rows and unit (the C++ Layout's HEAD)
    stores_m: bool  # the kernels read an m beside d
    qs_bytes: int  # bytes of BlockWeight.qs per row and unit
    split: Callable[[np.ndarray, str, int, int], BlockWeight]
    values: Callable[[BlockWeight], Tensors]  # (v int32 [N, K/P, P], dw [N, K/P], mw | None)
    pack: Callable[[BlockWeight], Tensors]  # (qs uint8 [groups, bytes], d, m | None)
    amx: bool = False  # the "amx" path runs it on the tile unit (else its VNNI tiles)

    def packed_nbytes(self, n: int, k: int) -> int:
        """Bytes of `pack`'s tensors for an [n, k] weight (rows padded to groups of 16)."""
        per_unit = self.head + self.unit // QK * 64 * self.bits
        return groups(n) * (k // self.unit) * (per_unit + 2 * GROUP_ROWS * (1 + self.stores_m))


def _q4q8(raw: np.ndarray, type_name: str, n: int, k: int) -> BlockWeight:
    qs, d, m = q4q8.split(raw, type_name, n, k)
    return BlockWeight("q8" if m is None else "q4", qs, d, m, type_name)


def _kq(raw: np.ndarray, type_name: str, n: int, k: int) -> BlockWeight:
    super_block = type_name.endswith("_K")
    p = (kquants.split_k if super_block else kquants.split_q5)(raw, type_name, n, k)
    form = {"Q5_0": "q50", "Q5_1": "q5", "Q4_K": "q4k", "Q5_K": "q5k"}[type_name]

    def opt(a: np.ndarray | None) -> torch.Tensor | None:
        return None if a is None else torch.from_numpy(a)

    t = torch.from_numpy
    return BlockWeight(form, t(p.qs), t(p.d), t(p.m), type_name, opt(p.qh), opt(p.sc), opt(p.mn))


def _q6k(raw: np.ndarray, type_name: str, n: int, k: int) -> BlockWeight:
    planes, d6 = q6k.split_q6k(raw, n, k)
    return BlockWeight("q6k", planes, d6.float(), None, type_name)


def _kq_values(w: BlockWeight) -> Tensors:
    assert w.m is not None
    return kquants.values(w.qs, w.qh), *kquants.block_scales(w.d, w.m, w.sc, w.mn)


def _kq_pack(keep_m: bool) -> Callable[[BlockWeight], Tensors]:
    return lambda w: kquants.pack(w.qs, w.qh, w.d, w.m if keep_m else None, w.sc, w.mn)


def _q4_values(w: BlockWeight) -> Tensors:
    return unpack_nibbles(w.qs), w.d, w.m


def _q8_values(w: BlockWeight) -> Tensors:
    return w.qs.reshape(w.qs.shape[0], -1, QK).to(torch.int32), w.d, None


def _q6k_values(w: BlockWeight) -> Tensors:
    return *q6k.pieces(w.qs, w.d), None


_KQ_PACK, _Q50_PACK = _kq_pack(True), _kq_pack(False)
# form, code, GGUF types (file bytes per unit), bits, unit, head, stores_m, qs_bytes,
# split, values, pack
# fmt: off
ROWS = [
    Format("q4", 0, {"Q4_0": 18, "Q4_1": 20}, 4, QK, 0, True, 16,
           _q4q8, _q4_values, lambda w: q4q8.pack(w.qs, w.d, w.m, False)),
    Format("q8", 1, {"Q8_0": 34}, 8, QK, 0, False, 32,
           _q4q8, _q8_values, lambda w: q4q8.pack(w.qs, w.d, None, True), amx=True),
    Format("q5", 2, {"Q5_1": 24}, 5, QK, 0, True, 16, _kq, _kq_values, _KQ_PACK, amx=True),
    Format("q4k", 3, {"Q4_K": 144}, 4, 256, 256, True, 128, _kq, _kq_values, _KQ_PACK),
    Format("q5k", 4, {"Q5_K": 176}, 5, 256, 256, True, 128, _kq, _kq_values, _KQ_PACK, amx=True),
    Format("q6k", 5, {"Q6_K": q6k.BLOCK_BYTES}, 6, 256, 256, False, q6k.PLANE_BYTES,
           _q6k, _q6k_values, lambda w: q6k.pack(w.qs, w.d)),
    Format("q50", 6, {"Q5_0": 22}, 5, QK, 0, False, 16, _kq, _kq_values, _Q50_PACK, amx=True),
    Format("iq4xs", 7, {"IQ4_XS": 136}, 4, 256, 128, False, 128,
           iq4xs.split, iq4xs.values, iq4xs.pack),
    Format("iq4nl", 8, {"IQ4_NL": 18}, 4, QK, 0, False, 16, iq4nl.split, iq4nl.values, iq4nl.pack),
]
# fmt: on
FORMATS = {f.form: f for f in ROWS}
LAYOUTS.update(FORMATS)  # what BlockWeight.shape and nbytes read
FORMS = tuple(FORMATS)
FMT_CODES = {f.form: f.code for f in ROWS}  # the qlinear op's fmt per form
AMX_FORMS = tuple(f.form for f in ROWS if f.amx)
# GGUF type name -> (kernel form, bytes per unit of the file: 32 inputs, or 256)
GGUF_BLOCK_TYPES = {t: (f.form, size) for f in ROWS for t, size in f.gguf.items()}


def kernel_label(form: str, isa: str) -> str:
    """What serves a weight of `form` on kernel path `isa`, for the load log."""
    label = f"qlinear {form} {isa}"
    return (
        label
        if isa != "amx" or form in AMX_FORMS
        else f"{label} (VNNI tiles: no AMX path for {form})"
    )


def from_gguf(raw: np.ndarray, type_name: str, n: int, k: int) -> BlockWeight:
    """Split GGUF blocks ([N, K / unit * block bytes] uint8, rows in the file's order) into
    the kernel arrays. Every value is kept: d, m are widened float16 -> float32."""
    if type_name not in GGUF_BLOCK_TYPES:
        raise ValueError(
            f"GGUF type {type_name} has no kernel (supported: {', '.join(GGUF_BLOCK_TYPES)})"
        )
    f = FORMATS[GGUF_BLOCK_TYPES[type_name][0]]
    if k % f.unit:
        raise ValueError(f"{type_name} needs the input dim ({k}) to be a multiple of {f.unit}")
    return f.split(raw, type_name, n, k)


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


def block_values(bw: BlockWeight) -> Tensors:
    """(q int32 [N, K/P, P], dw [N, K/P], mw like dw or None): w = dw * q + mw per piece of
    P inputs: P = 32 (a block), 16 for q6k (one sub-scale each)."""
    return FORMATS[bw.form].values(bw)


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


def pack_blocks(w: BlockWeight) -> Tensors:
    """The C++ kernels' layout (scheduler_worker/kernels/csrc/quant/formats.h): rows in
    groups of 16 (the last one padded with zero weights), each group's blocks with the 16
    rows' bytes interleaved 4 at a time; d and m as float16 (every value is one: they come
    from GGUF's float16 fields or are rounded so by quantize_q4/q8). Returns (qs uint8
    [groups, units * bytes], d float16 [groups, units, 16], m like d or None)."""
    return FORMATS[w.form].pack(w)
