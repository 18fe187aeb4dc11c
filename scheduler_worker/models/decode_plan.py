"""A decode step's decoder layers as one C++ call (torch.ops.zeroserve.decode_layers,
kernels/csrc/decode_model.cpp): the plan holds, flat and in the op's order, every layer's
norm weights and integer-kernel blocks, with the per-layer sliding windows and RoPE table
choice and the model's style flags (its family's decode_style, common/families, checked
against its recipe: plan_style). The decoder (decoder.py) builds one at load when every
decoder linear takes the kernels.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from scheduler_worker.activations import GELU_TANH_ACTS
from scheduler_worker.attention import AttentionMetadata
from scheduler_worker.models.common import ModelArgs
from scheduler_worker.quant.linear import QuantLinear
from scheduler_worker.quant.stacked import kernel_parts

# decode_layers' style flags (decode_model.cpp), by the names a Family's decode_style uses
QK_NORM, SANDWICH, GELU_TANH = 1, 2, 4
STYLE_FLAGS = {"qk_norm": QK_NORM, "sandwich": SANDWICH, "gelu_tanh": GELU_TANH}


def style_of(names: tuple[str, ...]) -> int:
    """A Family's decode_style as the op's flags (KeyError on a name it does not know)."""
    flags = 0
    for name in names:
        flags |= STYLE_FLAGS[name]
    return flags


def plan_style(args: ModelArgs) -> int | None:
    """The op's flags for this model, or None where its family never takes the op or
    its recipe has what the op lacks (the layers then run one by one): the op knows
    pre-norm RMSNorm layers, sandwich ones (SANDWICH), per-head QK-norm (QK_NORM),
    SiLU or GELU-tanh (GELU_TANH) gated MLPs, full rotary, no residual multiplier."""
    if args.decode_style is None:
        return None
    style, r = style_of(args.decode_style), args.recipe
    fits = (
        r.norm == "rms"
        and r.pre_norm
        and r.post_norm == bool(style & SANDWICH)
        and r.qk_norm == ("head" if style & QK_NORM else None)
        and r.gated_mlp
        and not r.parallel_residual
        and not r.learned_positions
        and args.rotary_dim == args.head_dim
        and args.residual_multiplier == 1.0
        and args.hidden_act in (GELU_TANH_ACTS if style & GELU_TANH else ("silu", "swish"))
    )
    return style if fits else None


@dataclass
class DecodePlan:
    """Everything torch.ops.zeroserve.decode_layers needs that does not change between
    steps: every layer's norm weights and block weights, flat, in the op's order."""

    weights: list[torch.Tensor]
    formats: list[int]  # (block format, out features) of every linear
    isa: int
    scale: float  # attention's softmax scale
    probe: QuantLinear  # any of the layers' linears: they route rows alike
    layer_windows: list[int] = field(default_factory=list)  # per layer, 0: global
    layer_rope: list[int] = field(default_factory=list)  # per layer, its (cos, sin) pair
    style: int = 0  # QK_NORM | SANDWICH | GELU_TANH

    def takes(self, meta: AttentionMetadata, rows: int) -> bool:
        """A decode-only step whose rows all go to the integer kernels (the op set made
        the plan only where its decode attention is the op's: CpuKernelOps)."""
        return meta.num_decode == rows and self.probe.kernel_rows(rows) == rows

    def run(
        self,
        args: ModelArgs,
        residual: torch.Tensor,
        positions: torch.Tensor,
        rope: list[torch.Tensor],
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        meta: AttentionMetadata,
        eps: float,
    ) -> torch.Tensor:
        """The decoder layers in one call; returns the last layer's MLP output (residual
        is updated in place)."""
        x: torch.Tensor = torch.ops.zeroserve.decode_layers(
            residual,
            self.weights,
            self.formats,
            [kv[0] for kv in kv_caches],
            [kv[1] for kv in kv_caches],
            positions,
            rope,
            self.layer_rope,
            self.layer_windows,
            meta.slot_mapping,
            meta.decode_block_tables,
            meta.decode_context_lens,
            args.num_heads,
            args.num_kv_heads,
            eps,
            self.scale,
            self.style,
            self.isa,
        )
        return x


def plan_decode_layers(
    items: list[torch.Tensor | nn.Module],
    scale: float,
    layer_windows: list[int | None],
    layer_rope: list[int],
    style: int,
) -> DecodePlan | None:
    """A DecodePlan from every layer's norm weights (tensors) and linears, flat, in the
    op's order (decode_model.cpp), or None when some linear (or part of one) has no kernel
    or the linears do not all take one kernel path."""
    weights: list[torch.Tensor] = []
    formats: list[int] = []
    linears: list[QuantLinear] = []
    for item in items:
        if isinstance(item, torch.Tensor):
            weights.append(item.detach().contiguous())
            continue
        parts = kernel_parts(item)
        if parts is None:
            return None
        for part in parts:
            weights.extend(part.kernel_tensors()[:3])  # qs, d, m
        bias = parts[0].kernel_tensors()[3] if len(parts) == 1 else getattr(item, "bias", None)
        weights.append(torch.empty(0) if bias is None else bias.detach())
        formats.append(len(parts))
        for part in parts:
            formats += [part.fmt, part.out_features]
        linears += parts
    first = linears[0]
    same = {
        (lin.isa_index, lin.dense is None, lin.dense_above, id(lin.step_rows)) for lin in linears
    }
    if len(same) != 1:
        return None
    windows = [w or 0 for w in layer_windows]
    return DecodePlan(weights, formats, first.isa_index, scale, first, windows, layer_rope, style)
