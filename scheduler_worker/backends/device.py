"""What the engine asks of a device before or beside its Backend, asked in this one place:
which device and dtype a model gets, how a host tensor reaches the device and a result
comes back, whether work is only enqueued there, what FP8 it has, how tensor-parallel
ranks talk. Code outside backends/ calls these (or a Backend's methods) and never tests a
device's type itself (tests/scheduler_worker/test_device_room.py).

    --device auto|cpu|cuda ──▶ resolve_device ──▶ resolve_dtype (--dtype auto)
    host tensor ──to_device──▶ (a GPU: pinned, non-blocking)
    device result ──HostCopy──▶ host tensors (a GPU: pinned copies behind an event)
"""

from __future__ import annotations

import torch

from common.config import ConfigError
from common.cpu import has_native_bf16

TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _gpu(device: torch.device) -> bool:
    return device.type == "cuda"


def device_kind(name: str) -> str:
    """--device's kind: cuda or cpu for auto (where a GPU is usable), else as given."""
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return name


def resolve_device(name: str) -> torch.device:
    """--device as a torch device; ConfigError for cuda where none is usable."""
    if name == "cuda" and not torch.cuda.is_available():
        why = (
            "this torch is a CPU build"
            if torch.version.cuda is None
            else f"torch {torch.__version__} (CUDA {torch.version.cuda}) finds no usable GPU"
        )
        raise ConfigError(
            f"--device cuda: {why}; install a CUDA build of torch on a GPU machine, "
            "or serve with --device cpu"
        )
    return torch.device(device_kind(name))


def resolve_dtype(name: str, device: torch.device, quantized: bool = False) -> torch.dtype:
    """--dtype: as named, or auto: bfloat16 on a GPU that has it (else float16); on a CPU
    float32 under block-quantized linears (the kernels quantize the activations anyway, and
    the rest of the step has no casts: docs/benchmarks.md, "Decode step"), else bfloat16
    where the CPU has native bf16 matmuls (AVX512-BF16 / AMX), else float32."""
    if name != "auto":
        return TORCH_DTYPES[name]
    if _gpu(device):
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    if quantized:
        return torch.float32
    return torch.bfloat16 if has_native_bf16() else torch.float32


def builds_on_host(device: torch.device) -> bool:
    """A model for this device is built and converted in host memory (a CPU), not made in
    its dtype on the device and filled tensor by tensor (a GPU: loader.py)."""
    return not _gpu(device)


def runs_cpu_kernels(device: torch.device) -> bool:
    """The C++ kernels (quantized linears, decode ops) serve this device's models."""
    return device.type == "cpu"


def enqueues_work(device: torch.device) -> bool:
    """Work on this device is only enqueued: a branch on a value there waits for it."""
    return device.type != "cpu"


def in_host_memory(t: torch.Tensor) -> bool:
    return t.device.type == "cpu"


def to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor onto `device`; to a GPU through pinned memory, non-blocking (a
    pageable copy waits for the stream, which may hold the step in flight)."""
    if t.device == device:
        return t
    if in_host_memory(t) and _gpu(device):
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


def pinned(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor made to stage copies to `device`: pinned for a GPU."""
    return t.pin_memory() if _gpu(device) else t


class HostCopy:
    """Device tensors (or None) copied to the host without waiting: on a GPU into pinned
    memory behind an event, which wait() synchronizes; on a CPU the tensors as they are."""

    def __init__(self, tensors: list[torch.Tensor | None]) -> None:
        first = next((t for t in tensors if t is not None), None)
        self._event: torch.cuda.Event | None = None
        if first is None or not _gpu(first.device):
            self.tensors = tensors
            return
        self.tensors = [None if t is None else _pinned_copy(t) for t in tensors]
        self._event = torch.cuda.Event()
        self._event.record(torch.cuda.current_stream(first.device))

    def wait(self) -> list[torch.Tensor | None]:
        if self._event is not None:
            self._event.synchronize()
        return self.tensors


def _pinned_copy(t: torch.Tensor) -> torch.Tensor:
    return torch.empty(t.shape, dtype=t.dtype, pin_memory=True).copy_(t, non_blocking=True)


def fp8_capability_problem(capability: tuple[int, int]) -> str | None:
    """Why a GPU of this CUDA capability cannot take FP8 matmuls, or None (sm_89 and later:
    Ada, Hopper, Blackwell have FP8 tensor cores)."""
    if capability >= (8, 9):
        return None
    major, minor = capability
    return (
        f"this GPU is sm_{major}{minor}; FP8 tensor cores need CUDA capability 8.9 or later "
        "(Ada, Hopper, Blackwell)"
    )


def fp8_problem(device: torch.device) -> str | None:
    """Why this device cannot run FP8 matmuls, or None; a CPU emulates them (quant/fp8.py)."""
    if not _gpu(device):
        return None
    return fp8_capability_problem(torch.cuda.get_device_capability(device))


def fp8_emulated(device: torch.device) -> bool:
    """FP8 matmuls run emulated in float32 here (a CPU), not on tensor cores."""
    return not _gpu(device)


def collective_backend(kind: str) -> str:
    """torch.distributed's backend for ranks on `kind` devices: NCCL on CUDA, else gloo."""
    return "nccl" if kind == "cuda" else "gloo"


# what gloo all-reduces and gathers as they are; it has no bfloat16 or float16 sum
GLOO_REDUCE_DTYPES = (torch.float32, torch.float64, torch.int64, torch.int32)


def reduce_dtype(collective: str, dtype: torch.dtype) -> torch.dtype:
    """The dtype a tensor of `dtype` is summed in by `collective` (collective_backend's
    name): float32 for a half type under gloo (cast back after, and the sum rounds as
    float32's), else `dtype` itself (NCCL reduces bfloat16 as it is)."""
    if collective == "gloo" and dtype not in GLOO_REDUCE_DTYPES:
        return torch.float32
    return dtype


def rank_device(kind: str, local_rank: int) -> torch.device:
    """A tensor-parallel rank's device: its own GPU (made current), or the CPU."""
    if kind != "cuda":
        return torch.device("cpu")
    torch.cuda.set_device(local_rank)
    return torch.device("cuda", local_rank)
