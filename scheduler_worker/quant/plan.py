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
from common.cpu import check_kernel_choice, cpu_flags, has_native_bf16
from scheduler_worker import kernels
from scheduler_worker.quant.fp8 import fp8_device_problem
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
        elif device.type != "cpu":
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
    problem = None
    if device.type == "cuda":
        problem = fp8_device_problem(device)
    if method == "auto":
        if problem is not None:
            return WeightPlan("none", None, f"auto: an FP8 checkpoint dequantized ({problem})")
        on = "emulated in float32 on the CPU" if device.type == "cpu" else "FP8 matmuls"
        return WeightPlan("fp8", None, f"auto: the FP8 checkpoint as stored, {on}")
    if method == "none":
        return WeightPlan("none", None, f"{why}: the FP8 checkpoint dequantized")
    if problem is not None:
        raise ConfigError(f"--quantization fp8: {problem}; serve with --quantization none")
    if device.type == "cpu":
        why += ": E4M3 weights, the FP8 matmul emulated in float32 on the CPU (slow)"
    return WeightPlan("fp8", None, why)


def kernel_path(choice: str) -> str | None:
    """The one ISA path (kernels.ISAS) every C++ op takes for --kernels `choice`: the best
    this CPU has (as ZEROSERVE_CPU_KIND presents it) for auto, None for pure torch."""
    if choice == "torch":
        return None
    if not kernels.load():  # logs why, once
        if choice != "auto":
            raise ConfigError(
                f"--kernels {choice}: the C++ kernels are not available here (see the log)"
            )
        return None
    if choice == "auto":
        return kernels.best_isa()
    check_kernel_choice(choice)  # by the CPU's flags
    best = kernels.best_isa()  # by the C++ side: AMX needs the OS's permission too
    if kernels.isa_index(choice) > kernels.isa_index(best):
        raise ConfigError(
            f"--kernels {choice}: the kernels run {best} at best here (the OS refused "
            "the AMX tile permission: Linux 5.16 or later grants it)"
        )
    return choice
