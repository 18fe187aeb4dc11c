"""Q6_K weights on the C++ kernels (qlinear fmt 5, csrc/qgemm_q6k*.{h,cpp}; the layout made
by quant/q6k.py's pack) against gguf-py's own dequantize: random shapes with tails in N,
whole super-blocks in K, batches of 1 to 65 rows, on every ISA path this machine has and the
portable one; a one-bit change anywhere in the packed weight must show."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from scheduler_worker import kernels
from scheduler_worker.quant.formats import FORMATS, quantize_activations
from scheduler_worker.quant.q6k import (
    BLOCK_BYTES,
    GR,
    GROUP_BYTES,
    SUB_BYTES,
    pack,
    split_q6k,
    values,
)

needs_kernels = pytest.mark.skipif(not kernels.load(), reason="the C++ kernels are not built here")
ISAS = [
    i
    for i in kernels.ISAS
    if kernels.load() and kernels.isa_index(i) <= kernels.isa_index(kernels.best_isa())
]
Q6_K = gguf.GGMLQuantizationType.Q6_K


def q6k_linear(
    x: torch.Tensor, qs: torch.Tensor, d: torch.Tensor, n: int, isa: int
) -> torch.Tensor:
    """x [M, K] @ W.T with W the Q6_K weight in the kernels' layout (`pack`), on path `isa`."""
    return torch.ops.zeroserve.qlinear(x, qs, d, None, FORMATS["q6k"].code, n, isa)


def _random_q6k(n: int, k: int, seed: int, odd_scales: bool = False) -> np.ndarray:
    """Valid Q6_K bytes: random planes and int8 sub-scales of either sign (odd ones: never
    zero), a finite float16 super-scale of either sign across two decades."""
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, (n, k // 256, BLOCK_BYTES), dtype=np.uint8)
    if odd_scales:
        blocks[:, :, 192:208] |= 1
    d = rng.uniform(0.5, 1.0, (n, k // 256)) * 10.0 ** rng.uniform(-4, -2, (n, k // 256))
    d *= rng.choice([-1.0, 1.0], d.shape)
    blocks[:, :, 208:] = d.astype(np.float16).view(np.uint8).reshape(n, k // 256, 2)
    return blocks.reshape(n, -1)


def _packed(raw: np.ndarray, n: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    qs, d = split_q6k(raw, n, k)
    pq, pd, m = pack(qs, d.float())
    assert m is None
    return pq, pd


def _oracle(x: torch.Tensor, raw: np.ndarray, n: int, k: int) -> torch.Tensor:
    """gguf-py's dequantized weight times the activations as the kernels quantize them
    (int8 per block of 32), in float64."""
    w = torch.from_numpy(gguf.quants.dequantize(raw, Q6_K).reshape(n, k)).double()
    q, d, _ = quantize_activations(x)
    xa = (q.double().view(x.shape[0], -1, 32) * d.double()[..., None]).view(x.shape)
    return xa @ w.T


def _close(y: torch.Tensor, ref: torch.Tensor) -> bool:
    scale = ref.abs().max().item()
    return bool(torch.allclose(y.double(), ref, rtol=1e-5, atol=1e-5 * scale))


def test_pack_moves_bits_only():
    """An independent reader of the layout (csrc/quant/formats.h's comment) gets back every q, every
    sub-scale and every super-scale of the file; whole groups take exactly its bytes."""
    n, k = 37, 768
    raw = _random_q6k(n, k, 3)
    qs, d = split_q6k(raw, n, k)
    pq, pd = _packed(raw, n, k)
    g, nsb = -(-n // GR), k // 256
    assert pq.shape == (g, nsb * GROUP_BYTES) and pd.shape == (g, nsb, GR)
    assert (
        pq.numel() + 2 * pd.numel()
        == FORMATS["q6k"].packed_nbytes(n, k)
        == g * GR * nsb * BLOCK_BYTES
    )
    u = pq.view(g, nsb, GROUP_BYTES).to(torch.int64)
    sc = u[..., :256].view(g, nsb, 16, GR)  # [group, super-block, piece, row]
    sub = u[..., 256:].reshape(g, nsb, 8, SUB_BYTES)
    nib = sub[..., :256].view(g, nsb, 8, 4, GR, 4)  # [.., k, row, j]
    top = sub[..., 256:].view(g, nsb, 8, 2, GR, 4)  # [.., piece, row, j]
    q = torch.empty(g, GR, nsb, 8, 2, 4, 4, dtype=torch.int64)  # [.., piece, k, j]
    for kk in range(4):
        hi2 = (top >> (2 * kk)) & 3
        q[:, :, :, :, 0, kk] = ((nib[..., kk, :, :] & 15) | (hi2[..., 0, :, :] << 4)).permute(
            0, 3, 1, 2, 4
        )
        q[:, :, :, :, 1, kk] = ((nib[..., kk, :, :] >> 4) | (hi2[..., 1, :, :] << 4)).permute(
            0, 3, 1, 2, 4
        )
    assert torch.equal(q.reshape(g * GR, k)[:n], values(qs).to(torch.int64))
    file_sc = qs.view(n, nsb, 208)[..., 192:].view(torch.int8)
    assert torch.equal(
        sc.permute(0, 3, 1, 2).reshape(g * GR, nsb, 16)[:n].to(torch.uint8),
        file_sc.view(torch.uint8),
    )
    assert torch.equal(pd.transpose(1, 2).reshape(g * GR, nsb)[:n], d)
    assert not pd.transpose(1, 2).reshape(g * GR, nsb)[n:].any()  # padded rows weigh zero
    assert not sc.permute(0, 3, 1, 2).reshape(g * GR, -1)[n:].any()
    with pytest.raises(ValueError, match="float16"):
        pack(qs, d.float() + 1e-6)


def _shapes() -> list[tuple[int, int, int]]:
    """(M, N, K): N a single short group, a tail group, whole groups; K 1 to 6 super-blocks;
    M tiles of 2 (AVX2) and 4 (VNNI) rows and their remainders, up to 65; plus random ones."""
    fixed = [(1, 5, 256), (2, 37, 512), (3, 64, 768), (4, 16, 256), (5, 80, 1536)]
    fixed += [(7, 13, 1280), (16, 40, 512), (33, 17, 256), (64, 48, 512), (65, 9, 256)]
    rng = np.random.default_rng(21)
    rand = [
        (int(rng.integers(1, 66)), int(rng.integers(1, 100)), 256 * int(rng.integers(1, 7)))
        for _ in range(6)
    ]
    return fixed + rand


@needs_kernels
@pytest.mark.parametrize("isa", ISAS)
def test_q6k_linear_equals_gguf_dequantize(isa):
    for seed, (m, n, k) in enumerate(_shapes()):
        raw = _random_q6k(n, k, seed)
        pq, pd = _packed(raw, n, k)
        x = torch.randn(m, k, generator=torch.Generator().manual_seed(seed))
        ref = _oracle(x, raw, n, k)
        y = q6k_linear(x, pq, pd, n, kernels.isa_index(isa))
        assert y.dtype == torch.float32 and y.shape == (m, n)
        assert _close(y, ref), (isa, m, n, k, (y.double() - ref).abs().max().item())
        # and the float weight itself, up to the 8-bit activations
        w = torch.from_numpy(gguf.quants.dequantize(raw, Q6_K).reshape(n, k)).double()
        exact = x.double() @ w.T
        torch.testing.assert_close(
            y.double(), exact, rtol=0.05, atol=0.05 * exact.abs().max().item()
        )
        yb = q6k_linear(x.bfloat16(), pq, pd, n, kernels.isa_index(isa))
        refb = _oracle(x.bfloat16().float(), raw, n, k)
        assert yb.dtype == torch.bfloat16 and yb.shape == (m, n)
        torch.testing.assert_close(
            yb.double(), refb, rtol=1e-2, atol=1e-2 * refb.abs().max().item()
        )


@needs_kernels
@pytest.mark.parametrize("isa", ISAS)
def test_one_bit_flip_in_the_packed_weight_fails_the_check(isa):
    """Every packed byte is read with its meaning: a flipped bit in any region (sub-scales,
    nibbles, top bits, super-scales) moves the output past the check's tolerance. Odd
    sub-scales and activations far from zero keep every weight's change visible."""
    m, n, k = 3, 32, 512
    raw = _random_q6k(n, k, 5, odd_scales=True)
    pq, pd = _packed(raw, n, k)
    gen = torch.Generator().manual_seed(5)
    x = (torch.rand(m, k, generator=gen) * 0.5 + 0.5) * (
        torch.randint(0, 2, (m, k), generator=gen) * 2 - 1
    )
    ref = _oracle(x, raw, n, k)
    assert _close(q6k_linear(x, pq, pd, n, kernels.isa_index(isa)), ref)
    rng = np.random.default_rng(7)
    flat = pq.view(-1)
    # a byte of each region of a super-block, then random ones
    first = [3, 256 + 5, 256 + 256 + 7, 256 + 320 + 9, 256 + 7 * SUB_BYTES + 383]
    picks = first + [int(i) for i in rng.integers(0, flat.numel(), 16)]
    for at in picks:
        bit = int(rng.integers(0, 8))
        bad = flat.clone()
        bad[at] ^= 1 << bit
        y = q6k_linear(x, bad.view_as(pq), pd, n, kernels.isa_index(isa))
        assert not _close(y, ref), (at, bit)
    for at in (0, pd.numel() - 1, int(rng.integers(0, pd.numel()))):
        bad_d = pd.clone().view(-1)
        bad_d.view(torch.int16)[at] ^= 1 << 9  # a mantissa bit of one super-scale
        y = q6k_linear(x, pq, bad_d.view_as(pd), n, kernels.isa_index(isa))
        assert not _close(y, ref), at


@needs_kernels
def test_q6k_refuses_bad_shapes():
    raw = _random_q6k(20, 512, 0)
    pq, pd = _packed(raw, 20, 512)
    with pytest.raises(RuntimeError, match="K % 256"):
        q6k_linear(torch.randn(2, 300), pq, pd, 20, 0)
    with pytest.raises(RuntimeError, match="does not match"):
        q6k_linear(torch.randn(2, 768), pq, pd, 20, 0)
    with pytest.raises(RuntimeError, match="d must be float16"):
        q6k_linear(torch.randn(2, 512), pq, pd.float(), 20, 0)
    with pytest.raises(RuntimeError, match="do not fit"):
        q6k_linear(torch.randn(2, 512), pq, pd, 33, 0)
    with pytest.raises(RuntimeError, match="wrong shape"):
        q6k_linear(torch.randn(2, 512), pq[:, :-1].contiguous(), pd, 20, 0)
    with pytest.raises(ValueError, match="needs"):
        split_q6k(raw, 21, 512)
