"""Q6_K weights on the C++ kernels (qlinear fmt 5) against gguf-py's own dequantize, on
every ISA path this machine has and the portable one."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from scheduler_worker import kernels
from scheduler_worker.quant.formats import quantize_activations
from scheduler_worker.quant.q6k import BLOCK_BYTES, q6k_linear, split_q6k

pytestmark = pytest.mark.skipif(not kernels.load(), reason="the C++ kernels are not built here")
ISAS = [i for i in kernels.ISAS if kernels.isa_index(i) <= kernels.isa_index(kernels.best_isa())]
Q6_K = gguf.GGMLQuantizationType.Q6_K


def _random_q6k(n: int, k: int, seed: int) -> np.ndarray:
    """Valid Q6_K bytes: random planes and int8 scales, a finite float16 super-scale."""
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, (n, k // 256, BLOCK_BYTES), dtype=np.uint8)
    d = (rng.random((n, k // 256)) * 1e-3 + 1e-5).astype(np.float16)
    blocks[:, :, 208:] = d.view(np.uint8).reshape(n, k // 256, 2)
    return blocks.reshape(n, -1)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("m,n,k", [(1, 5, 256), (3, 37, 512), (16, 64, 768), (64, 9, 256)])
def test_q6k_linear_equals_gguf_dequantize(isa, m, n, k):
    raw = _random_q6k(n, k, seed=m * n)
    w = torch.from_numpy(gguf.quants.dequantize(raw, Q6_K).reshape(n, k)).double()
    qs, d = split_q6k(raw, n, k)
    assert qs.numel() + 2 * d.numel() == raw.size  # the file's bytes, no more
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(n))
    xq, xd, _ = quantize_activations(x)  # what the kernel multiplies: 8-bit activations
    xa = (xq.double().view(m, -1, 32) * xd.double()[..., None]).view(m, k)
    ref = xa @ w.T
    y = q6k_linear(x, qs, d, n, kernels.isa_index(isa))
    assert y.dtype == torch.float32 and y.shape == (m, n)
    scale = ref.abs().max().item()
    torch.testing.assert_close(y.double(), ref, rtol=1e-4, atol=1e-4 * scale)
    torch.testing.assert_close(y.double(), x.double() @ w.T, rtol=0.05, atol=0.05 * scale)
    yb = q6k_linear(x.bfloat16(), qs, d, n, kernels.isa_index(isa))
    assert yb.dtype == torch.bfloat16 and yb.shape == (m, n)


def test_q6k_refuses_bad_shapes():
    raw = _random_q6k(4, 512, 0)
    qs, d = split_q6k(raw, 4, 512)
    with pytest.raises(RuntimeError, match="K % 256"):
        q6k_linear(torch.randn(2, 300), qs, d, 4, 0)
    with pytest.raises(RuntimeError, match="d must be float16"):
        q6k_linear(torch.randn(2, 256), qs, d, 4, 0)
    with pytest.raises(ValueError, match="needs"):
        split_q6k(raw, 5, 512)
