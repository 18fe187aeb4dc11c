"""Which backend serves a loaded model: by its device (the one place that asks)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from common.config import EngineConfig
from common.log import get_logger
from scheduler_worker.backends.base import Backend
from scheduler_worker.backends.cpu import CpuBackend, StepRows
from scheduler_worker.kernels import kernel_path
from scheduler_worker.kernels.shapes import decode_ops_refusal

log = get_logger("model_runner")


@dataclass(frozen=True)
class ModelShape:
    """What a backend reads of the loaded model (loader.LoadedModel), passed down."""

    device: torch.device
    dtype: torch.dtype
    num_heads: int
    num_kv_heads: int
    head_dim: int
    weights_isa: str | None  # the quantized linears' kernel path (WeightPlan.isa)


def make_backend(
    config: EngineConfig, model: ModelShape, step_rows: StepRows, max_model_len: int
) -> Backend:
    if model.device.type == "cuda":
        from scheduler_worker.backends.cuda import CudaBackend  # Triton: a GPU build's

        sched = config.scheduler.resolved("cuda")
        return CudaBackend(
            model.dtype,
            config.cache.block_size,
            num_kv_heads=model.num_kv_heads,
            max_num_seqs=sched.num_seqs,
            max_num_batched_tokens=sched.num_batched_tokens,
            max_model_len=max_model_len,
            gpu_memory_utilization=config.cache.gpu_memory_utilization,
            enforce_eager=config.model.enforce_eager,
            head_dim=model.head_dim,
            gemv=config.model.gemv,
        )
    return CpuBackend(
        model.dtype, config.cache.block_size, cpu_kernel_isa(config, model), step_rows
    )


def cpu_kernel_isa(config: EngineConfig, model: ModelShape) -> str | None:
    """The C++ decode ops (attention, norms, activation) serve float32/bfloat16 CPU
    models unless --kernels torch asks for pure torch, on the same ISA path as the
    quantized linears (--kernels, ZEROSERVE_CPU_KIND); None for pure torch."""
    if model.dtype not in (torch.float32, torch.bfloat16):
        return None
    isa = model.weights_isa or kernel_path(config.model.kernels)
    why = decode_ops_refusal(model.num_heads, model.num_kv_heads, model.head_dim)
    if isa is not None and why is not None:
        log.warning("C++ decode ops off (%s): attention, norms and RoPE in pure torch", why)
        return None
    return isa
