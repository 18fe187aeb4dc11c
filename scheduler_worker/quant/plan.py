"""Which weights a model's linears get, and which kernel path serves them, with the reason
the server logs.

    --quantization auto ─▶ an FP8 checkpoint: "fp8" (as stored; quant/fp8.py)
                       ─▶ tensor parallelism: "none" (each rank's float shard)
                       ─▶ a GGUF model on the CPU: "gguf" (the file's own blocks: the
                           model the user downloaded; formats without a kernel are
                           dequantized row by row on the fly, never held as floats)
                       ─▶ anything else: "none" (float weights, exact)
    --kernels auto ──────▶ the best ISA path the CPU has (AMX, AVX-512 VNNI, AVX2, scalar C++),
                           or pure torch (dequantized weights) when the C++ kernels cannot
                           be built here
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from common.config import ConfigError, ModelConfig
from common.cpu import cpu_flags, has_native_bf16
from scheduler_worker.backends.device import fp8_emulated, fp8_problem, runs_cpu_kernels
from scheduler_worker.kernels import kernel_path
from scheduler_worker.quant.linear import dense_dtype_for


@dataclass(frozen=True)
class WeightPlan:
    method: str  # "none" | "gguf" | "int8" | "int4" | "fp8"
    isa: str | None  # kernel path for quantized linears; None: pure torch
    reason: str
    dense_dtype: torch.dtype | None = None  # dense copy for prompt tokens, big batches


def plan_weights(
    cfg: ModelConfig, device: torch.device, gguf: Path | None, fp8_checkpoint: bool = False
) -> WeightPlan:
    method, why = cfg.quantization, f"--quantization {cfg.quantization}"
    tp = cfg.tensor_parallel_size
    if tp > 1 and (fp8_checkpoint or method not in ("auto", "none")):
        raise ConfigError(
            f"--quantization {method} with --tensor-parallel-size {tp}: the ranks' shards are "
            "float weights for now (--quantization auto or none"
            + (", of a float or GGUF checkpoint)" if fp8_checkpoint else ")")
        )
    if fp8_checkpoint or method == "fp8":
        return plan_fp8(method, why, device, fp8_checkpoint)
    if method == "auto":
        if tp > 1:
            method, why = (
                "none",
                f"auto with --tensor-parallel-size {tp}: float shards"
                + (f" (the GGUF's matrices dequantized at load, {gguf.name})" if gguf else ""),
            )
        elif not runs_cpu_kernels(device):
            method, why = "none", f"auto on {device.type}: the quantized kernels are CPU-only"
        elif cfg.dtype == "float16":
            method, why = (
                "none",
                "auto with float16: the quantized kernels take float32 or bfloat16",
            )
        elif gguf is not None:
            method, why = "gguf", f"auto: serving the GGUF file's own blocks ({gguf.name})"
        else:
            method, why = (
                "none",
                "auto: a float checkpoint keeps its weights (--quantization int8|int4 to quantize)",
            )
    # common.model_files.model_source.check_quantization_source refused gguf without a file
    assert method != "gguf" or gguf is not None
    if method == "none":
        return WeightPlan("none", None, why)
    isa = kernel_path(cfg.kernels)
    # the bf16 copy for prompt tokens is opt-in: by default the weights held are the file's
    # bytes on every CPU kind (issue 21: within 1.1x), prompt tokens on the kernels' tiles
    dense = (
        dense_dtype_for(isa, has_native_bf16(), "amx_bf16" in cpu_flags())
        if isa is not None and cfg.prefill_dense_copy
        else None
    )
    if cfg.prefill_dense_copy and dense is None:
        why += "; --prefill-dense-copy: no copy kept (the integer kernels are faster on this CPU)"
    return WeightPlan(method, isa, why, dense)


def plan_fp8(method: str, why: str, device: torch.device, checkpoint: bool) -> WeightPlan:
    """fp8 (E4M3 weights, quant/fp8.py) or none for --quantization fp8, or for an FP8
    checkpoint (auto: as stored, where FP8 matmuls run or are emulated; none: dequantized).
    A GPU without FP8 tensor cores refuses fp8 in one line; auto dequantizes there."""
    problem = fp8_problem(device)
    if method == "auto":
        if problem is not None:
            return WeightPlan("none", None, f"auto: an FP8 checkpoint dequantized ({problem})")
        on = "emulated in float32 on the CPU" if fp8_emulated(device) else "FP8 matmuls"
        return WeightPlan("fp8", None, f"auto: the FP8 checkpoint as stored, {on}")
    if method == "none":
        return WeightPlan("none", None, f"{why}: the FP8 checkpoint dequantized")
    if problem is not None:
        raise ConfigError(f"--quantization fp8: {problem}; serve with --quantization none")
    if fp8_emulated(device):
        why += ": E4M3 weights, the FP8 matmul emulated in float32 on the CPU (slow)"
    return WeightPlan("fp8", None, why)
