"""An FP8 checkpoint's layout, read from its config.json `quantization_config` (torch-free:
launch.py refuses what cannot be served before anything starts).

    quant_method "compressed-tensors"    llm-compressor / RedHat: `weight_scale` per output
      weights: type float, 8 bits        channel ("channel", [N, 1]), per tensor ("tensor",
                                         a scalar), or per block ("block", block_structure)
    quant_method "fp8"                   Qwen3-FP8, DeepSeek: `weight_scale_inv` [N/bn, K/bk]
      weight_block_size [bn, bk]         (multiplied, despite its name), or without a block
                                         size one `weight_scale` per tensor

Activations are quantized per token on the fly whatever the file says: a static
`input_scale` is dropped (docs/fp8.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


class CheckpointQuantError(ValueError):
    """A quantization_config the engine cannot serve, in one line."""


@dataclass(frozen=True)
class Fp8Layout:
    kind: str  # "channel" | "tensor" | "block"
    scale_name: str  # the scale tensors' suffix: "weight_scale" | "weight_scale_inv"
    block: tuple[int, int] | None = None  # (rows, columns) of a block-wise layout
    source: str = ""  # the quant_method, for the log

    def describe(self) -> str:
        how = f"{self.block[0]}x{self.block[1]} blocks" if self.block else f"per {self.kind}"
        return f"FP8 E4M3 checkpoint ({self.source}, {how}, `{self.scale_name}`)"


def fp8_layout(hf: dict[str, Any]) -> Fp8Layout | None:
    """The FP8 layout of a checkpoint's config.json, None when it has no quantization_config;
    CheckpointQuantError for any other quantization."""
    qc = hf.get("quantization_config")
    if not qc:
        return None
    if not isinstance(qc, dict):
        raise CheckpointQuantError(f"quantization_config is not a table: {qc!r}")
    method = qc.get("quant_method")
    if method == "fp8":
        fmt = qc.get("fmt", "e4m3")
        if fmt != "e4m3":
            raise CheckpointQuantError(f"FP8 checkpoint in format {fmt!r}: only e4m3 is served")
        block = qc.get("weight_block_size")
        if block is None:
            return Fp8Layout("tensor", "weight_scale", None, "fp8")
        return Fp8Layout("block", "weight_scale_inv", _block(block), "fp8")
    if method == "compressed-tensors":
        return _compressed_tensors(qc)
    raise CheckpointQuantError(
        f"checkpoint quantization {method!r} is not supported (served: FP8 checkpoints, "
        "compressed-tensors or quant_method fp8; GGUF files)"
    )


def _block(value: object) -> tuple[int, int]:
    if (
        not isinstance(value, (list, tuple))
        or len(value) != 2
        or not all(isinstance(v, int) and v > 0 for v in value)
    ):
        raise CheckpointQuantError(f"FP8 block size {value!r} is not two positive integers")
    return int(value[0]), int(value[1])


def _compressed_tensors(qc: dict[str, Any]) -> Fp8Layout:
    groups = qc.get("config_groups") or {}
    weights = [g.get("weights") or {} for g in groups.values() if isinstance(g, dict)]
    if not weights:
        raise CheckpointQuantError("compressed-tensors checkpoint without config_groups weights")
    kinds = set()
    for w in weights:
        if w.get("type") != "float" or w.get("num_bits") != 8:
            raise CheckpointQuantError(
                f"compressed-tensors weights of type {w.get('type')!r} with "
                f"{w.get('num_bits')!r} bits: only FP8 (float, 8 bits) is served"
            )
        strategy = w.get("strategy")
        block = _block(w.get("block_structure")) if strategy == "block" else None
        if strategy not in ("channel", "tensor", "block"):
            raise CheckpointQuantError(
                f"compressed-tensors FP8 strategy {strategy!r} is not served "
                "(channel, tensor or block)"
            )
        kinds.add((strategy, block))
    if len(kinds) != 1:
        raise CheckpointQuantError(f"compressed-tensors groups mix FP8 strategies: {kinds}")
    strategy, block = kinds.pop()
    return Fp8Layout(strategy, "weight_scale", block, "compressed-tensors")
