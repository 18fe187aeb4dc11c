"""Which backend serves a loaded model: by its device (the one place that asks)."""

from __future__ import annotations

import torch

from common.config import EngineConfig
from common.log import get_logger
from scheduler_worker.backends.base import Backend
from scheduler_worker.backends.cpu import CpuBackend
from scheduler_worker.kernels.shapes import decode_ops_refusal
from scheduler_worker.loader import LoadedModel
from scheduler_worker.quant.linear import StepRows
from scheduler_worker.quant.plan import kernel_path

log = get_logger("model_runner")


def make_backend(
    config: EngineConfig, loaded: LoadedModel, step_rows: StepRows, max_model_len: int
) -> Backend:
    if loaded.device.type == "cuda":
        from scheduler_worker.backends.cuda import CudaBackend  # Triton: a GPU build's

        sched = config.scheduler.resolved("cuda")
        return CudaBackend(
            loaded.dtype,
            config.cache.block_size,
            num_kv_heads=loaded.args.num_kv_heads,
            max_num_seqs=sched.num_seqs,
            max_num_batched_tokens=sched.num_batched_tokens,
            max_model_len=max_model_len,
            gpu_memory_utilization=config.cache.gpu_memory_utilization,
            enforce_eager=config.model.enforce_eager,
            head_dim=loaded.args.head_dim,
        )
    return CpuBackend(
        loaded.dtype, config.cache.block_size, cpu_kernel_isa(config, loaded), step_rows
    )


def cpu_kernel_isa(config: EngineConfig, loaded: LoadedModel) -> str | None:
    """The C++ decode ops (attention, norms, activation) serve float32/bfloat16 CPU
    models unless --kernels torch asks for pure torch, on the same ISA path as the
    quantized linears (--kernels, ZEROSERVE_CPU_KIND); None for pure torch."""
    if loaded.dtype not in (torch.float32, torch.bfloat16):
        return None
    isa = loaded.plan.isa or kernel_path(config.model.kernels)
    a = loaded.args
    why = decode_ops_refusal(a.num_heads, a.num_kv_heads, a.head_dim)
    if isa is not None and why is not None:
        log.warning("C++ decode ops off (%s): attention, norms and RoPE in pure torch", why)
        return None
    return isa
