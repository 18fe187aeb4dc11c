"""The cuts of the sampler's draw on a GPU (triton_sample.py), each a bisection over float
bits: top-k's k-th largest value of a row, and the top-p threshold of its probabilities.

A bisection over [lo, hi) of a row's values reads the row once a halving. Where the range's
values fit a scratch row of CAP floats (compacted in one read), the rest of the search runs
over them there: a chat row's top-p candidates (p >= (1 - top_p) / 2V, which must hold the
cut) fit at once; a near-flat row's, and top-k's, after the halvings that bring the range
to the row's dense part (a few: each then halves the range's values).

    a   = x / T, NaN -> -inf, +inf -> the largest float (scaled)
    p   = exp(a - max) / sum for the a kept by top-k, else 0 (probs)
    key = a's bits in order (_key): -0.0 just below +0.0
"""

from __future__ import annotations

import os

import triton
import triton.language as tl
from triton.language.extra import libdevice

# compiled (a GPU): exp as libdevice's expf (within 2 ulp, where tl.exp's ex2.approx of x *
# log2(e) is off by ~|x| ulp of x) and x / T rounded as IEEE's; the interpreter has neither
# libdevice nor inexact ops (numpy's)
_COMPILED = tl.constexpr(os.environ.get("TRITON_INTERPRET", "0") != "1")


@triton.jit
def exp(x):
    if _COMPILED:
        y = libdevice.exp(x)
    else:
        y = tl.exp(x)
    return y


@triton.jit
def scaled(x_row, offs, V, T):
    """a = x / T at offs (-inf past V), NaN -> -inf, +inf -> the largest float."""
    x = tl.load(x_row + offs, mask=offs < V, other=float("-inf"))
    a = tl.math.div_rn(x, T)
    a = tl.where(a != a, float("-inf"), a)
    return tl.where(a > 3.4028234663852886e38, 3.4028234663852886e38, a)


@triton.jit
def probs(x_row, offs, V, T, mx, lo, inv):
    """p = exp(a - mx) * inv for the a >= lo, else 0 (and past V)."""
    a = scaled(x_row, offs, V, T)
    return tl.where(a >= lo, exp(a - mx), 0.0) * inv


@triton.jit
def _key(a):
    """float32 -> int32 in the same order (-0.0 just below +0.0)."""
    bits = a.to(tl.int32, bitcast=True)
    return bits ^ ((bits >> 31) & 0x7FFFFFFF)


@triton.jit
def kth_largest(x_row, cand_row, V, T, k, CAP: tl.constexpr, TILE: tl.constexpr):
    """The k-th largest a (duplicates counted; 1 <= k < V): the largest key K with at least
    k keys >= K, by bisection over [klo, khi) (c_hi keys >= khi): halvings over the whole
    row until the range's keys fit the scratch row, then over them there."""
    offs0 = tl.arange(0, TILE)
    klo = tl.sum(tl.zeros([TILE], tl.int64), 0) - 2147483648  # every key >= klo
    khi = klo + 4294967296  # none >= khi
    c_hi = tl.sum(tl.zeros([TILE], tl.int64), 0)
    count = c_hi + V  # keys in [klo, khi)
    while (count > CAP) & (khi - klo > 1):
        mid = klo + (khi - klo) // 2
        cnt = tl.zeros([TILE], tl.int32)
        for start in range(0, V, TILE):
            offs = start + offs0
            key = _key(scaled(x_row, offs, V, T)).to(tl.int64)
            cnt += ((key >= mid) & (offs < V)).to(tl.int32)
        ge = tl.sum(cnt, 0).to(tl.int64)
        ok = ge >= k
        count = tl.where(ok, ge - c_hi, count - (ge - c_hi))
        klo = tl.where(ok, mid, klo)
        khi = tl.where(ok, khi, mid)
        c_hi = tl.where(ok, c_hi, ge)
    n = tl.sum(tl.zeros([TILE], tl.int32), 0)  # the range's a into the scratch row
    for start in range(0, V, TILE):
        offs = start + offs0
        a = scaled(x_row, offs, V, T)
        key = _key(a).to(tl.int64)
        keep = (offs < V) & (key >= klo) & (key < khi)
        at = n + tl.cumsum(keep.to(tl.int32), 0) - 1
        tl.store(cand_row + at, a, mask=keep & (at < CAP))
        n += tl.sum(keep.to(tl.int32), 0)
    tl.debug_barrier()
    while khi - klo > 1:
        mid = klo + (khi - klo) // 2
        cnt = tl.zeros([TILE], tl.int32)
        for start in range(0, n, TILE):
            offs = start + offs0
            a = tl.load(cand_row + offs, mask=offs < n, other=float("-inf"))
            cnt += ((_key(a).to(tl.int64) >= mid) & (offs < n)).to(tl.int32)
        ok = c_hi + tl.sum(cnt, 0) >= k
        klo = tl.where(ok, mid, klo)
        khi = tl.where(ok, khi, mid)
    key = klo.to(tl.int32)
    return (key ^ ((key >> 31) & 0x7FFFFFFF)).to(tl.float32, bitcast=True)


@triton.jit
def _compact(x_row, cand_row, blo, bhi, V, T, mx, lo, inv, CAP: tl.constexpr, TILE: tl.constexpr):
    """The row's p > 0 whose bits lie in [blo, bhi) into the scratch row (the first CAP of
    them), in one read: (how many there are, their float64 mass, the row's, and how many
    of its p are > 0)."""
    offs0 = tl.arange(0, TILE)
    n = tl.sum(tl.zeros([TILE], tl.int32), 0)
    held = tl.zeros([TILE], tl.float64)
    total = tl.zeros([TILE], tl.float64)
    npos = tl.zeros([TILE], tl.int32)
    for start in range(0, V, TILE):
        p = probs(x_row, start + offs0, V, T, mx, lo, inv)
        bits = p.to(tl.int32, bitcast=True)
        keep = (p > 0.0) & (bits >= blo) & (bits < bhi)
        at = n + tl.cumsum(keep.to(tl.int32), 0) - 1
        tl.store(cand_row + at, p, mask=keep & (at < CAP))
        n += tl.sum(keep.to(tl.int32), 0)
        held += tl.where(keep, p, 0.0).to(tl.float64)
        total += p.to(tl.float64)
        npos += (p > 0.0).to(tl.int32)
    tl.debug_barrier()  # the stores seen by every thread before the scratch row is read
    return n, tl.sum(held, 0), tl.sum(total, 0), tl.sum(npos, 0)


@triton.jit
def top_p_cut(x_row, cand_row, V, T, mx, lo, inv, top_p, CAP: tl.constexpr, TILE: tl.constexpr):
    """The top-p threshold t of the row's p (0: every p kept): the largest bits b (a value
    present in the row) with mass(p >= b) >= goal, by bisection over [blo, bhi), with
    mass(p >= bhi) = s_hi known. The p >= floor are compacted first (most rows: all of the
    search); where they overflow the scratch row, halvings over the whole row narrow the
    range until its tokens fit, then they are compacted and the search goes on over them."""
    offs0 = tl.arange(0, TILE)
    goal = tl.maximum(top_p, 1e-30)
    floor = ((1.0 - goal) / (2.0 * V)).to(tl.float32)
    fb = floor.to(tl.int32, bitcast=True)
    # one read: the p >= floor compacted, their mass, the row's, its p > 0
    n, s_held, s_total, npos = _compact(x_row, cand_row, fb, 0x3F800001, V, T, mx, lo, inv,
                                        CAP, TILE)  # fmt: skip
    reached = s_total >= goal
    above = s_held >= goal  # the cut lies among the p >= floor (else below them all)
    blo = tl.where(above, fb, 0)
    bhi = tl.where(above, 0x3F800001, fb)  # 0x3F800001: past 1.0, no mass
    s_hi = tl.where(above, 0.0, s_held)
    count = tl.where(above, n, npos - n)
    compacted = above & (n <= CAP)
    # halvings over the whole row until the range's tokens fit the scratch row
    while (count > CAP) & (bhi - blo > 1):
        mid = blo + (bhi - blo) // 2
        v = mid.to(tl.float32, bitcast=True)
        m = tl.zeros([TILE], tl.float64)
        c_up = tl.zeros([TILE], tl.int32)
        c_all = tl.zeros([TILE], tl.int32)
        for start in range(0, V, TILE):
            p = probs(x_row, start + offs0, V, T, mx, lo, inv)
            bits = p.to(tl.int32, bitcast=True)
            inside = (p > 0.0) & (bits >= blo) & (bits < bhi)
            m += tl.where(p >= v, p, 0.0).to(tl.float64)
            c_up += (inside & (bits >= mid)).to(tl.int32)
            c_all += inside.to(tl.int32)
        s_mid = tl.sum(m, 0)
        ok = s_mid >= goal
        up = tl.sum(c_up, 0)
        count = tl.where(ok, up, tl.sum(c_all, 0) - up)
        blo = tl.where(ok, mid, blo)
        bhi = tl.where(ok, bhi, mid)
        s_hi = tl.where(ok, s_hi, s_mid)
    if not compacted:
        n, _, _, _ = _compact(x_row, cand_row, blo, bhi, V, T, mx, lo, inv, CAP, TILE)
    # the rest of the search over the range's tokens, in the scratch row: the mass at or
    # above a value in it is theirs at or above it and the mass above the range's top
    s_top = s_hi
    while bhi - blo > 1:
        mid = blo + (bhi - blo) // 2
        v = mid.to(tl.float32, bitcast=True)
        m = tl.zeros([TILE], tl.float64)
        for start in range(0, n, TILE):
            offs = start + offs0
            p = tl.load(cand_row + offs, mask=offs < n, other=0.0)
            m += tl.where(p >= v, p, 0.0).to(tl.float64)
        ok = s_top + tl.sum(m, 0) >= goal
        blo = tl.where(ok, mid, blo)
        bhi = tl.where(ok, bhi, mid)
    return tl.where(reached, blo.to(tl.float32, bitcast=True), 0.0)
