"""The top-p cut without sorting the vocabulary.

A row keeps the smallest set of its most likely tokens that holds top_p of its mass, and
every token tied with the last one kept: its threshold t is the probability of the token at
which the running mass (largest first) reaches top_p, or 0 where it never does (all kept).
The mass above a token is summed in float64, whichever way it is found, so the cut is the
same on every device and in any summation order (up to ~1e-16 of mass).

Two ways to t, the same t:

    window: a row's most likely tokens, sorted (torch.topk, or the top-k filter's own
            candidates): t when their mass reaches top_p, or when nothing past them can be
            kept (a top-k row: past its candidates only ties of the last one, and zeros)
    radix:  any row, two passes, no branch on the data (so no wait on a GPU): non-negative
            float32s order as their bit patterns, so the row's mass in bins of the high 16
            bits finds the bin where the running mass reaches top_p, and the mass of that
            bin's values by their low 16 bits (bins of one value each) finds t

        bits of p:  [ 16 high: 2^7 bins per power of two ][ 16 low: one value per bin ]
                        pass 1: histogram of mass            pass 2: in bin b1 only

On a CPU, where a branch costs nothing, a row tries windows of TOP_P_WINDOWS tokens first
and only the rows they do not hold take the radix search; on a GPU (`may_branch` False)
every row without a top-k window takes it. Measurements: docs/benchmarks.md, "Top-p
without a sort".
"""

from __future__ import annotations

import sys

import numpy as np
import torch

from scheduler_worker.logits_processors import DeviceColumns, _column

TOP_P_WINDOWS = (256,)  # on a CPU, windows tried before the radix search
TOP_K_WINDOW = 4096  # a top-k row's candidates are its window while k is no larger
SORT_VOCAB = 4096  # a vocabulary this short is sorted: cheaper than the histograms
_HIGH = 0x3F80  # the high 16 bits of 1.0f: no probability's are larger
_TINY = 1e-30  # a top_p below this (0 once a float32) keeps the most likely token, as 1e-30 does

assert sys.byteorder == "little"  # the int16 view's odd halves are the high bits


def top_p_thresholds(
    probs: torch.Tensor,
    top_ps: np.ndarray,
    top_ks: np.ndarray,
    candidates: torch.Tensor | None,
    may_branch: bool,
    cols: DeviceColumns | None = None,
) -> torch.Tensor:
    """Each row's threshold [rows, 1] (0 where top_p is 1) for probs [rows, vocab] after
    top-k. top_ps: each row's top_p (float64); top_ks: each row's k (0: off); candidates:
    the ids of each row's max(top_ks) largest logits (the top-k filter's), or None. A top-k
    row's cut lies among its candidates, so they are its window while k <= TOP_K_WINDOW;
    other rows: top_p_threshold. cols: the sampler's columns kept on the device, or None."""
    dev, f32 = probs.device, torch.float32
    thresh = probs.new_zeros(len(top_ps), 1)
    rows = (top_ps < 1.0).nonzero()[0]
    if candidates is not None and top_ks.max() <= TOP_K_WINDOW:
        has_k = top_ks[rows] != 0
        windowed, searched = rows[has_k], rows[~has_k]
    else:
        windowed, searched = rows[:0], rows
    if len(windowed):
        assert candidates is not None
        sel = _column(cols, "top_p.windowed", windowed, dev, torch.long)
        window = probs.gather(1, candidates).index_select(0, sel)
        window = window.sort(dim=-1, descending=True).values
        top_p = _column(cols, "top_p.window", top_ps[windowed], dev, f32)[:, None]
        thresh.index_copy_(0, sel, window_threshold(window, top_p)[0])
    if len(searched):
        sel = _column(cols, "top_p.searched", searched, dev, torch.long)
        sub = probs if len(searched) == len(top_ps) else probs.index_select(0, sel)
        top_p = _column(cols, "top_p", top_ps[searched], dev, f32)[:, None]
        thresh.index_copy_(0, sel, top_p_threshold(sub, top_p, may_branch))
    return thresh


def top_p_threshold(probs: torch.Tensor, top_p: torch.Tensor, may_branch: bool) -> torch.Tensor:
    """t [rows, 1] for probs [rows, vocab] (float32 in [0, 1], a row's mass ~1) and top_p
    [rows, 1]: the row keeps probs >= t. `may_branch`: rows may take different ways (on a
    CPU: windows first); else every row takes the radix search."""
    if probs.shape[1] <= SORT_VOCAB:
        return window_threshold(probs.sort(dim=-1, descending=True).values, top_p)[0]
    if not may_branch:
        return radix_threshold(probs, top_p)
    thresh = torch.zeros_like(top_p)
    todo = torch.arange(probs.shape[0], device=probs.device)
    for size in [n for n in TOP_P_WINDOWS if n < probs.shape[1]]:
        sub = probs if len(todo) == probs.shape[0] else probs[todo]
        cut, held = window_threshold(sub.topk(size).values, top_p[todo])
        thresh[todo[held]] = cut[held]
        todo = todo[~held]
        if len(todo) == 0:
            return thresh
    sub = probs if len(todo) == probs.shape[0] else probs[todo]
    thresh[todo] = radix_threshold(sub, top_p[todo], grouped=True)
    return thresh


def window_threshold(
    window: torch.Tensor, top_p: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """From each row's K largest probabilities, sorted (descending): (t [rows, 1], held
    [rows] bool), t right where held: the mass reaches top_p inside the window. A row
    where nothing past its window is kept but ties of the window's last value and zeros
    (a top-k row's candidates) needs no `held`: its t is right either way."""
    size = window.shape[1]
    mass = window.double().cumsum(dim=-1)
    # at least one: a top_p that is 0 in float32 keeps the most likely token
    num_keep = ((mass - window) < top_p).sum(dim=-1, keepdim=True)
    held = (num_keep[:, 0] < size) | (mass[:, -1] >= top_p[:, 0])
    return window.gather(1, num_keep.clamp_(1, size) - 1), held


def radix_threshold(
    probs: torch.Tensor, top_p: torch.Tensor, grouped: bool = False
) -> torch.Tensor:
    """t [rows, 1] for every row by two histograms of mass over the bits of probs (float32
    in [0, 1]), with no branch on the data. `grouped`: each histogram searched by groups of
    bins, then inside the group (fewer passes over the bins, more small ops: a CPU's
    choice; a GPU launches fewer kernels without). A row that is not a distribution (NaN)
    gets some t, without an out-of-range index."""
    probs = probs.contiguous()
    rows, dev = probs.shape[0], probs.device
    goal = top_p.double().clamp(min=_TINY)
    src = probs.double()
    idx = probs.view(torch.int16)[:, 1::2].clamp(0, _HIGH).long()  # the high 16 bits
    hist = torch.zeros(rows, 1 << 14, dtype=torch.float64, device=dev)
    b1, reached = _crossing(hist.scatter_add_(1, idx, src), goal, 1 << 7 if grouped else 0)
    # pass 2: b1's values by their low 16 bits; every value above b1 lands in the top bin
    # (the mass above the bin is what it must count) and every one below in bin 0
    base = b1.int() << 16
    torch.sub(probs.view(torch.int32), base, out=idx).clamp_(0, (1 << 16) - 1)
    hist = torch.zeros(rows, 1 << 16, dtype=torch.float64, device=dev)
    b2, _ = _crossing(hist.scatter_add_(1, idx, src), goal, 1 << 8 if grouped else 0)
    t = (base + b2.int()).view(torch.float32)
    return torch.where(reached, t, 0.0)


def _crossing(
    hist: torch.Tensor, goal: torch.Tensor, width: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The highest bin [rows, 1] whose mass with every bin's above it reaches goal, and
    whether any does (else bin 0); width > 0: first among groups of `width` bins, then in
    the group."""
    if not width:
        found, short = _reach(hist.flip(1).cumsum_(1), goal)
        return found, short < hist.shape[1]
    groups = hist.view(hist.shape[0], -1, width)
    from_top = groups.sum(dim=-1).flip(1).cumsum_(1)
    group, short = _reach(from_top, goal)
    above = torch.where(short > 0, from_top.gather(1, (short - 1).clamp(min=0)), 0.0)
    inside = groups.gather(1, group[:, :, None].expand(-1, 1, width))[:, 0]
    found, _ = _reach(inside.flip(1).cumsum_(1).add_(above), goal)
    return group * width + found, short < from_top.shape[1]


def _reach(from_top: torch.Tensor, goal: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """From each row's running mass over its bins from the top: the bin (counted from the
    bottom) where it first reaches goal, or bin 0; and how many bins fall short of it."""
    num_bins = from_top.shape[1]
    short = (from_top < goal).sum(dim=1, keepdim=True)
    return (num_bins - 1) - short.clamp(max=num_bins - 1), short
