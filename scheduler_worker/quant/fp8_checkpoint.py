"""An FP8 checkpoint loaded as stored (common/model_files/fp8_config.py reads its layout).

    safetensors headers ──▶ which HF weights are E4M3 (and their shapes)
    model on meta ──swap_in_fp8──▶ those linears become Fp8Linear [N, K] E4M3 + [N, G]
    tensors ──fp8_weights──▶ each scale tensor as one float32 row per output channel:
        per channel [N, 1] / [N]  ─▶ [N, 1]
        per tensor  scalar        ─▶ [N, 1], repeated
        block [N/bn, K/bk]        ─▶ [N, K/bk], each block row repeated bn times
    so q/k/v (and gate/up) shards stack on dim 0 as their weights do; a static
    input_scale is dropped (activations are quantized per token on the fly).
Linears the file keeps in bf16 (an `ignore`d lm_head) stay nn.Linear.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn

from common.model_files.fp8_config import Fp8Layout
from scheduler_worker.models.common import STACKED_PIECES
from scheduler_worker.quant.fp8 import FP8, Fp8Linear, dequantize


def fp8_weight_shapes(model_dir: Path) -> dict[str, tuple[int, int]]:
    """HF name -> [N, K] of every E4M3 matrix of the checkpoint (headers only)."""
    shapes: dict[str, tuple[int, int]] = {}
    for file in sorted(Path(model_dir).glob("*.safetensors")):
        with safe_open(file, framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 (safe_open is not a dict)
                sl = f.get_slice(name)
                if sl.get_dtype() == "F8_E4M3":
                    shape = tuple(sl.get_shape())
                    if len(shape) != 2:
                        raise ValueError(f"FP8 tensor {name} has shape {shape}, not a matrix")
                    shapes[name] = (int(shape[0]), int(shape[1]))
    return shapes


def module_name(hf_name: str) -> str:
    """The model's linear that HF weight `hf_name` loads into (q/k/v and gate/up stacked)."""
    name = hf_name.removeprefix("model.").removesuffix(".weight")
    for piece, (fused, _) in STACKED_PIECES.items():
        if name.endswith(f".{piece}"):
            return name.removesuffix(piece) + fused
    return name


def swap_in_fp8(model: nn.Module, shapes: dict[str, tuple[int, int]], layout: Fp8Layout) -> int:
    """Replace (on the meta device) every linear whose checkpoint weights are E4M3 by an
    Fp8Linear of its shape; ValueError when a stacked linear mixes E4M3 and float pieces or
    the rows do not add up. Returns how many."""
    rows: dict[str, int] = {}
    for hf_name, (n, _k) in shapes.items():
        rows[module_name(hf_name)] = rows.get(module_name(hf_name), 0) + n
    with torch.device("meta"):
        for name, n in rows.items():
            parent, _, leaf = name.rpartition(".")
            owner = model.get_submodule(parent) if parent else model
            linear = getattr(owner, leaf, None)
            if not isinstance(linear, nn.Linear):
                raise ValueError(f"FP8 weight for {name}, which is not a linear of this model")
            out, k = linear.weight.shape
            if n != out:
                raise ValueError(
                    f"{name}: its E4M3 pieces hold {n} of {out} rows (a stacked linear must "
                    "be E4M3 in every piece)"
                )
            group = 0 if layout.block is None else layout.block[1]
            groups = 1 if layout.block is None else -(-k // group)
            bias = None if linear.bias is None else torch.empty(out)
            weight = torch.empty(out, k, dtype=FP8)
            setattr(owner, leaf, Fp8Linear(weight, torch.empty(out, groups), bias, group))
    return len(rows)


def row_scales(t: torch.Tensor, layout: Fp8Layout, n: int, k: int) -> torch.Tensor:
    """A checkpoint's scale tensor for an [n, k] weight as float32 [n, G] (see above)."""
    t = t.float()
    if layout.block is not None:
        bn, bk = layout.block
        want = (-(-n // bn), -(-k // bk))
        if tuple(t.shape) != want:
            raise ValueError(f"block scales {tuple(t.shape)} for a [{n}, {k}] weight: want {want}")
        return t.repeat_interleave(bn, dim=0)[:n].contiguous()
    if t.numel() == 1:
        return t.reshape(1, 1).expand(n, 1).contiguous()
    if t.numel() == n:
        return t.reshape(n, 1).contiguous()
    raise ValueError(f"scales {tuple(t.shape)} fit neither a channel nor a tensor of [{n}, {k}]")


def fp8_weights(
    weights: Iterable[tuple[str, torch.Tensor]],
    layout: Fp8Layout,
    shapes: dict[str, tuple[int, int]],
) -> Iterator[tuple[str, torch.Tensor]]:
    """The checkpoint's tensors as the model's loader takes them: scales renamed to
    `weight_scale` and laid out per output channel; input scales dropped."""
    suffix = "." + layout.scale_name
    for name, t in weights:
        if name.endswith(".input_scale"):
            continue
        if name.endswith(suffix):
            prefix = name.removesuffix(suffix)
            if prefix + ".weight" not in shapes:
                raise ValueError(f"scale {name} without an E4M3 weight {prefix}.weight")
            n, k = shapes[prefix + ".weight"]
            yield prefix + ".weight_scale", row_scales(t, layout, n, k)
        else:
            yield name, t


def dequantize_fp8(model: nn.Module, dtype: torch.dtype) -> int:
    """Every Fp8Linear back to an nn.Linear of `dtype` (--quantization none on an FP8
    checkpoint: a GPU without FP8 tensor cores, or the tests' reference)."""
    names = [n for n, m in model.named_modules() if isinstance(m, Fp8Linear)]
    for name in names:
        parent, _, leaf = name.rpartition(".")
        owner = model.get_submodule(parent) if parent else model
        fp8 = getattr(owner, leaf)
        linear = nn.Linear(fp8.in_features, fp8.out_features, fp8.bias is not None, device="meta")
        w = dequantize(fp8.weight, fp8.weight_scale, dtype, fp8.group_size)
        linear.weight = nn.Parameter(w, False)
        if fp8.bias is not None:
            linear.bias = nn.Parameter(fp8.bias.detach().to(dtype), False)
        setattr(owner, leaf, linear)
    return len(names)
