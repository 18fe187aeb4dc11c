"""A step's draw on a GPU in one Triton launch: the CPU's C++ op (kernels/csrc/sample_rows.cpp)
as a kernel, one program a row, the same contract and the same numbers but for the exp and
the order of float32 sums.

    sample_rows(logits [R, V] f32, draw [R] i64, params [R, 4] f64, u [D, n] f32) -> [R] i64
        draw[r] < 0: the argmax (NaN counting as largest, the first index: torch's max)
        else: temperature, top-k, top-p, min-p, then the two-level race on u[draw[r]]
        params: temperature, top_k (0: off), top_p, min_p; n = sampling.num_uniforms(V)

Where the torch path issues ~80 ops over the whole [rows, vocab] batch (the division,
top-k, the +inf/NaN repair, softmax, top-p's two float64 histograms of 2^14 and 2^16 bins
a row, min-p, the mask, the padded block sums and two races), a row here is read ~4 times
and nothing of [rows, vocab] is written. A drawing row, its logits x:

    pass 1    a = x / T repaired (NaN -> -inf, +inf -> the largest float), its max
    (top-k)   the k-th largest a by a bisection of its order-preserving bits: halvings over
              the row until the range's values fit a scratch row, then over them there
    pass 2    the sum of e = exp(a - max) over the a kept by top-k
    (top-p)   t is the largest value whose mass from the top, summed in float64, reaches
              top_p (top_p.py's definition: ties kept), by a bisection of its bits. The
              p = e / sum >= c = (1 - top_p) / 2V hold the cut (the rest cannot hold
              1 - top_p of the mass): compacted into a scratch row of CAP floats, the
              bisection runs over them (chat rows at temperature 0.7: all of the search).
              Where they overflow it (a row at temperature 1 or more), halvings over the
              whole row narrow the range until its tokens fit, a read each (a few: each
              halves the range's tokens once it reaches the row's dense part), then the
              search goes on over them. min-p raises t to p_max * min_p.
    pass 3    the race among blocks of 256 tokens by the sums of their p >= t, on the
              row's first uniforms (argmin sum / log u, the first on ties), then among the
              winning block's tokens on the next 256

The cuts' bisections are triton_cuts.py's. `sample_rows_keyed` (the GPU backend's op) takes
a key a drawing row instead of its uniforms and makes them as seeded_uniforms does (a hash
of the key and the column): a seeded row's key is its seed's and token index's, so it
draws what it would alone, on any device. Every launch reads shapes and host ints only. Under TRITON_INTERPRET=1 the kernel runs on CPU tensors,
which is how the tests check it (tests/scheduler_worker/test_sample_rows.py).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from scheduler_worker.backends.triton_cuts import kth_largest, probs, scaled, top_p_cut

RACE = 256  # sampling.SAMPLE_BLOCK: tokens a block of the race
TILE = 2048  # tokens a program reads at once (8 race blocks)
CAP = 4096  # a row's top-p candidates kept in its scratch row
NUM_WARPS = 8  # a launch parameter only; the interpreter ignores it


@triton.jit
def _argmax(x_row, V, TILE: tl.constexpr):
    offs0 = tl.arange(0, TILE)
    mvec = tl.full([TILE], float("-inf"), tl.float32)
    nvec = tl.zeros([TILE], tl.int32)
    for start in range(0, V, TILE):
        x = tl.load(x_row + start + offs0, mask=start + offs0 < V, other=float("-inf"))
        nan = x != x
        mvec = tl.maximum(mvec, tl.where(nan, float("-inf"), x))
        nvec = nvec | nan.to(tl.int32)
    mx = tl.max(mvec, 0)
    has_nan = tl.max(nvec, 0) > 0
    ivec = tl.full([TILE], 2147483647, tl.int32)
    for start in range(0, V, TILE):
        offs = start + offs0
        x = tl.load(x_row + offs, mask=offs < V, other=float("-inf"))
        hit = tl.where(has_nan, x != x, x == mx) & (offs < V)
        ivec = tl.minimum(ivec, tl.where(hit, offs, 2147483647))
    i = tl.min(ivec, 0)
    return tl.where(i == 2147483647, 0, i).to(tl.int64)


@triton.jit
def _mix(x):
    """seeded_uniforms._mix on int64 values < 2**32 (every product stays under 2**63)."""
    x = ((x >> 16) ^ x) * 0x45D9F3B & 0xFFFFFFFF
    x = ((x >> 16) ^ x) * 0x45D9F3B & 0xFFFFFFFF
    return (x >> 16) ^ x


@triton.jit
def _uniforms(u_row, key, cols, mask, KEYED: tl.constexpr):
    """The row's uniforms at columns `cols`: read from its row of u, or (KEYED) made from
    its key as seeded_uniforms.uniforms makes them: a hash of the key and the column's."""
    if KEYED:
        x = _mix(key ^ _mix(cols.to(tl.int64) + 0x632BE5AB))
        u = ((x >> 8).to(tl.float32) + 0.5) * (1.0 / 16777216)
    else:
        u = tl.load(u_row + cols, mask=mask, other=0.5)
    return u


@triton.jit
def _draw(x_row, prm, u_row, key, cand_row, V, NB,
          CAP: tl.constexpr, TILE: tl.constexpr, RB: tl.constexpr, KEYED: tl.constexpr):  # fmt: skip
    T = tl.load(prm).to(tl.float32)
    offs0 = tl.arange(0, TILE)
    mvec = tl.full([TILE], float("-inf"), tl.float32)
    finite = tl.zeros([TILE], tl.int32)
    for start in range(0, V, TILE):
        a = scaled(x_row, start + offs0, V, T)
        mvec = tl.maximum(mvec, a)
        finite += (a > float("-inf")).to(tl.int32)
    mx = tl.max(mvec, 0)
    tok = tl.sum(tl.zeros([TILE], tl.int64), 0)  # a row masked everywhere: 0, as torch's
    if mx > float("-inf"):
        tok = _draw_kept(x_row, prm, u_row, key, cand_row, V, NB, T, mx, tl.sum(finite, 0),
                         CAP, TILE, RB, KEYED)  # fmt: skip
    return tok


@triton.jit
def _race(p, u):
    """An exponential race's values (the least wins): p / log(u), +inf where p is 0 (a u
    of 1.0, which the keyed hash can give, would make 0 / 0 a NaN)."""
    return tl.where(p > 0.0, tl.math.div_rn(p, tl.log(u)), float("inf"))


@triton.jit
def _draw_kept(x_row, prm, u_row, key, cand_row, V, NB, T, mx, num_finite,
               CAP: tl.constexpr, TILE: tl.constexpr, RB: tl.constexpr, KEYED: tl.constexpr):  # fmt: skip
    """_draw past the max, of a row with num_finite tokens not masked (at least one)."""
    top_k = tl.load(prm + 1).to(tl.int64)
    top_p = tl.load(prm + 2).to(tl.float32)  # as the C++ op and the torch path read it
    min_p = tl.load(prm + 3).to(tl.float32)
    offs0 = tl.arange(0, TILE)
    lo = tl.sum(tl.zeros([TILE], tl.float32), 0) - 3.4028234663852886e38  # -inf never kept
    if (top_k > 0) & (top_k < num_finite):  # else every finite token is among the k
        lo = tl.maximum(lo, kth_largest(x_row, cand_row, V, T, top_k, CAP, TILE))
    svec = tl.zeros([TILE], tl.float32)
    for start in range(0, V, TILE):
        svec += probs(x_row, start + offs0, V, T, mx, lo, 1.0)
    inv = tl.math.div_rn(tl.full([1], 1.0, tl.float32), tl.sum(svec, 0))
    inv = tl.sum(inv, 0)
    t = tl.sum(tl.zeros([TILE], tl.float32), 0)
    if top_p < 1.0:
        t = top_p_cut(x_row, cand_row, V, T, mx, lo, inv, top_p.to(tl.float64), CAP, TILE)
    if min_p > 0.0:
        t = tl.maximum(t, inv * min_p)  # inv: the largest p (exp(0) = 1)
    # the race among the blocks, G at a time: [G, RB] tiles, their sums
    G: tl.constexpr = TILE // RB
    gi = tl.arange(0, G)
    ri = tl.arange(0, RB)
    best_r = tl.sum(tl.zeros([G], tl.float32), 0) + float("inf")
    best_b = tl.sum(tl.zeros([G], tl.int32), 0)
    for start in range(0, NB * RB, TILE):
        offs = start + gi[:, None] * RB + ri[None, :]
        p = probs(x_row, offs, V, T, mx, lo, inv)
        sums = tl.sum(tl.where(p >= t, p, 0.0), 1)
        b = start // RB + gi
        r = tl.where(b < NB, _race(sums, _uniforms(u_row, key, b, b < NB, KEYED)), float("inf"))
        m = tl.min(r, 0)
        first = tl.min(tl.where(r == m, b, 2147483647), 0)
        take = m < best_r
        best_b = tl.where(take, first, best_b)
        best_r = tl.where(take, m, best_r)
    base = best_b * RB
    p = probs(x_row, base + ri, V, T, mx, lo, inv)
    r = _race(tl.where(p >= t, p, 0.0), _uniforms(u_row, key, NB + ri, ri < RB, KEYED))
    m = tl.min(r, 0)
    return (base + tl.min(tl.where(r == m, ri, RB), 0)).to(tl.int64)


@triton.jit
def _sample_rows_kernel(
    x_ptr,
    stride_x,
    draw_ptr,
    prm_ptr,
    u_ptr,
    stride_u,
    cand_ptr,
    out_ptr,
    V,
    NB,
    CAP: tl.constexpr,
    TILE: tl.constexpr,
    RB: tl.constexpr,
    KEYED: tl.constexpr,
):
    """u_ptr: the uniforms [D, n], or (KEYED) the drawing rows' keys [D] int64."""
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * stride_x
    d = tl.load(draw_ptr + row)
    if d < 0:
        tok = _argmax(x_row, V, TILE)
    else:
        u_row = u_ptr + d * stride_u
        if KEYED:
            key = tl.load(u_ptr + d)
        else:
            key = d
        cand = cand_ptr + row * CAP
        tok = _draw(x_row, prm_ptr + row * 4, u_row, key, cand, V, NB, CAP, TILE, RB, KEYED)
    tl.store(out_ptr + row, tok)


def sample_rows(
    logits: torch.Tensor, draw: torch.Tensor, params: torch.Tensor, u: torch.Tensor
) -> torch.Tensor:
    """Tokens [R] int64 for processed logits [R, V] (float32): the rows with draw < 0 take
    the argmax, the others draw on their row of u [D, n] (module doc)."""
    nb = -(-logits.shape[-1] // RACE)
    if u.dim() != 2 or u.dtype != torch.float32 or (u.shape[0] and u.shape[1] != nb + RACE):
        raise ValueError(f"sample_rows: u must be float32 [D, {nb + RACE}]")
    u = u.contiguous() if u.shape[0] else u.new_full((1, nb + RACE), 0.5)
    return _launch(logits, draw, params, u, u.stride(0), False)


def sample_rows_keyed(
    logits: torch.Tensor, draw: torch.Tensor, params: torch.Tensor, keys: torch.Tensor
) -> torch.Tensor:
    """sample_rows where each drawing row's uniforms are made in the kernel from its key
    [D] int64 (seeded_uniforms.row_keys), as seeded_uniforms.uniforms makes them: no
    [D, n] uniforms on the device, no generator launch (the GPU backend's draw op)."""
    if keys.dim() != 1 or keys.dtype != torch.long:
        raise ValueError("sample_rows_keyed: keys must be int64 [D]")
    keys = keys.contiguous() if keys.shape[0] else keys.new_zeros(1)
    return _launch(logits, draw, params, keys, 0, True)


def _launch(logits, draw, params, u, stride_u: int, keyed: bool) -> torch.Tensor:
    if logits.dim() != 2 or logits.dtype != torch.float32 or logits.stride(1) != 1:
        raise ValueError("sample_rows: logits must be float32 [R, V], rows contiguous")
    rows, vocab = logits.shape
    if draw.shape != (rows,) or draw.dtype != torch.long or not draw.is_contiguous():
        raise ValueError("sample_rows: draw must be a contiguous int64 [R]")
    if not draw.device == params.device == u.device == logits.device:
        raise ValueError("sample_rows: every input on the logits' device")
    if params.shape != (rows, 4) or params.dtype != torch.float64 or not params.is_contiguous():
        raise ValueError("sample_rows: params must be a contiguous float64 [R, 4]")
    out = torch.empty(rows, dtype=torch.long, device=logits.device)
    if rows == 0:
        return out
    _sample_rows_kernel[(rows,)](
        logits,
        logits.stride(0),
        draw,
        params,
        u,
        stride_u,
        # a scratch row of CAP floats a program; the call's own (the caching allocator
        # gives the same block back on one stream; two streams' calls never share one)
        torch.empty(rows * CAP, dtype=torch.float32, device=logits.device),
        out,
        vocab,
        -(-vocab // RACE),
        CAP=CAP,
        TILE=TILE,
        RB=RACE,
        KEYED=keyed,
        num_warps=NUM_WARPS,
    )
    return out


def warm_up(device: torch.device, vocab: int) -> None:
    """Compile the backend's variant (keyed) at start for this vocabulary (its launch is
    specialized on the row's stride): else the first sampled step stalls every stream for
    the compile."""
    params = torch.tensor([[1.0, 0.0, 0.9, 0.0]] * 2, dtype=torch.float64, device=device)
    logits = torch.zeros(2, vocab, device=device)
    keys = torch.tensor([12345], device=device)
    sample_rows_keyed(logits, torch.tensor([-1, 0], device=device), params, keys)
