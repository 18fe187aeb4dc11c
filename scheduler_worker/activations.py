"""The activations configs name, as torch functions (the C++ and Triton op sets fuse SiLU and
GELU-tanh with the multiply by `up`: backends/ops.py)."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F


def _gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate="tanh")


# the names configs give GELU's tanh approximation (the C++ kernel: gelu_tanh_mul)
GELU_TANH_ACTS = ("gelu_new", "gelu_pytorch_tanh", "gelu_fast")

ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "silu": F.silu,
    "swish": F.silu,
    "gelu": F.gelu,
    "gelu_new": _gelu_tanh,
    "gelu_pytorch_tanh": _gelu_tanh,
    "gelu_fast": _gelu_tanh,
    "relu": F.relu,
}
