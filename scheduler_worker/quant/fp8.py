"""FP8 (E4M3) linears: weights held as float8_e4m3fn with float32 scales.

    weight_scale [N, 1]   per output channel: w[n, k] = q[n, k] * s[n]
                          activations quantized per token on the fly (W8A8), the matmul
                          the op set's fp8_matmul: torch._scaled_mm on a GPU's FP8
                          tensor cores (sm_89+, backends/triton_fp8.py)
    weight_scale [N, G]   block-wise (Qwen3-FP8, DeepSeek: 128x128 blocks, the block rows
                          expanded to one scale row per output channel at load):
                          w[n, k] = q[n, k] * s[n, k // block_k]; weight-only FP8,
                          dequantized to the activations' dtype on the fly

On a CPU (and for shapes _scaled_mm refuses) the per-channel matmul is emulated in float32:
E4M3 widens to float32 exactly, so the emulation is the tensor cores' maths up to the
order of the float32 sums. It is the oracle of the tests and the serving path on a CPU
(slow: the weights are widened every step; docs/fp8.md).
"""

from __future__ import annotations

import re

import torch
import torch.nn.functional as F
from torch import nn

from scheduler_worker.backends.ops import TORCH_OPS, TorchOps

FP8 = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8).max)  # 448
_MIN_AMAX = 1e-12  # an all-zero row keeps a finite scale


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row of x [R, K] as E4M3 with its own float32 scale [R, 1] (amax / 448): the
    weights' per-output-channel scales and the activations' per-token ones."""
    xf = x.float()
    scale = xf.abs().amax(dim=-1, keepdim=True).clamp(min=_MIN_AMAX) / FP8_MAX
    q = (xf / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    return q, scale


def expand_groups(scale: torch.Tensor, k: int, group: int) -> torch.Tensor:
    """Scales [R, G] of column groups of `group` (the last may be short) as [R, k]."""
    if scale.shape[-1] == 1:
        return scale.expand(*scale.shape[:-1], k)
    return scale.repeat_interleave(group, dim=-1)[..., :k]


def dequantize(
    q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype, group: int = 0
) -> torch.Tensor:
    """q [N, K] E4M3 times its scales [N, G] (G column groups of `group`), as `dtype`."""
    return (q.float() * expand_groups(scale, q.shape[-1], group)).to(dtype)


def emulated_scaled_mm(
    qx: torch.Tensor, sx: torch.Tensor, qw: torch.Tensor, sw: torch.Tensor
) -> torch.Tensor:
    """torch._scaled_mm(qx, qw.t(), sx [M, 1], sw.t() [1, N]) in float32: the E4M3 values
    widened exactly, multiplied and summed in float32, the row and column scales applied
    to the sums. float32 [M, N]."""
    return (qx.float() @ qw.float().t()) * sx * sw.view(1, -1)


def fits_scaled_mm(n: int, k: int) -> bool:
    """torch._scaled_mm's shape rule: both matrices' dims divisible by 16 (M is free)."""
    return n % 16 == 0 and k % 16 == 0


class Fp8Linear(nn.Module):
    """A drop-in for nn.Linear over an E4M3 weight [N, K] and its float32 scales [N, G]."""

    weight: torch.Tensor
    weight_scale: torch.Tensor
    ops: TorchOps = TORCH_OPS  # the backend's op set (ModelRunner.use_ops)

    def __init__(
        self,
        weight: torch.Tensor,
        weight_scale: torch.Tensor,
        bias: torch.Tensor | None,
        group_size: int = 0,
    ) -> None:
        """group_size: the columns of a scale group where weight_scale has several (the
        block's width: 128); 0 with per-channel scales [N, 1]."""
        super().__init__()
        if weight.dtype != FP8 and weight.device.type != "meta":
            raise ValueError(f"Fp8Linear needs a float8_e4m3fn weight, got {weight.dtype}")
        if weight_scale.dim() != 2 or weight_scale.shape[0] != weight.shape[0]:
            raise ValueError(
                f"weight_scale {tuple(weight_scale.shape)} does not fit weight "
                f"{tuple(weight.shape)}: [N, 1] per channel or [N, groups]"
            )
        self.out_features, self.in_features = weight.shape
        groups = weight_scale.shape[1]
        if groups > 1 and (group_size < 1 or -(-self.in_features // group_size) != groups):
            raise ValueError(f"{groups} scale groups of {group_size} columns do not cover K")
        self.group_size = group_size
        # parameters (not buffers): the checkpoint loader writes them by name, as nn.Linear's
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.weight_scale = nn.Parameter(weight_scale, requires_grad=False)
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)

    @property
    def per_channel(self) -> bool:
        return self.weight_scale.shape[1] == 1

    @classmethod
    def quantize(cls, linear: nn.Linear) -> Fp8Linear:
        """nn.Linear's weight as E4M3 with per-output-channel scales (its bias as it is)."""
        q, scale = quantize_rows(linear.weight.detach())
        bias = None if linear.bias is None else linear.bias.detach()
        return cls(q, scale, bias)

    def extra_repr(self) -> str:
        kind = "per-channel" if self.per_channel else f"groups of {self.group_size} columns"
        return f"in={self.in_features}, out={self.out_features}, e4m3 {kind}"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])
        if not self.per_channel:  # weight-only: dequantized to the activations' dtype
            w = dequantize(self.weight, self.weight_scale, x.dtype, self.group_size)
            y = F.linear(x2, w, self.bias)
            return y.reshape(*shape[:-1], -1)
        if fits_scaled_mm(self.out_features, self.in_features):
            mm = self.ops.fp8_matmul(x2, self.weight, self.weight_scale, self.bias)
            if mm is not None:  # the op set's FP8 matmul (a GPU's tensor cores)
                return mm.reshape(*shape[:-1], -1)
        qx, sx = quantize_rows(x2)
        y = emulated_scaled_mm(qx, sx, self.weight, self.weight_scale)
        if self.bias is not None:
            y = y + self.bias.float()
        return y.to(x.dtype).reshape(*shape[:-1], -1)


# linears --quantization fp8 leaves in the model's dtype: the output head, as llm-compressor's
# recipes do (`ignore: [lm_head]`), and the last decoder layer's, the most sensitive one; the
# default model's perplexity then meets 2% of bf16's (docs/benchmarks.md, "FP8 recipes")
FP8_KEEP = ("lm_head",)
FP8_KEEP_LAST_LAYERS = 1
_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def fp8_targets(model: nn.Module, skip: tuple[str, ...], keep_last_layers: int) -> list[str]:
    """The names of the nn.Linears quantize_model_fp8 replaces: all but those whose last name
    is in `skip` and those of the last `keep_last_layers` decoder layers (`layers.<i>.`)."""
    names = [
        n
        for n, m in model.named_modules()
        if isinstance(m, nn.Linear) and n.rpartition(".")[2] not in skip
    ]
    layers = [int(m.group(1)) if (m := _LAYER.search(n)) else -1 for n in names]
    first_kept = max(layers, default=-1) + 1 - keep_last_layers
    return [n for n, i in zip(names, layers, strict=True) if i < 0 or i < first_kept]


def quantize_model_fp8(
    model: nn.Module, skip: tuple[str, ...] = (), keep_last_layers: int = 0
) -> int:
    """Every nn.Linear of a float model but fp8_targets' exceptions replaced by its
    per-channel Fp8Linear, in place; returns how many. A tied output head gets an E4M3 copy
    of the embedding; the embedding itself stays as it is."""
    names = fp8_targets(model, skip, keep_last_layers)
    with torch.no_grad():
        for name in names:
            parent, _, leaf = name.rpartition(".")
            owner = model.get_submodule(parent) if parent else model
            linear = getattr(owner, leaf)
            setattr(owner, leaf, Fp8Linear.quantize(linear))
    return len(names)
