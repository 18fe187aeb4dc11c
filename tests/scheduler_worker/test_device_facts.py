"""What backends/device.py and the backends answer for the code above them, on a CPU, and
the GPU's answers through stand-ins (the device's name and ids, its cache release, its
dtype), where the branches moved out of the engine, the worker and the loader."""

from __future__ import annotations

import pytest
import torch

from scheduler_worker import kernels
from scheduler_worker.backends import device as dev
from scheduler_worker.backends.cpu import CpuBackend
from scheduler_worker.quant.linear import StepRows
from tests.conftest import kernels_built

CPU = torch.device("cpu")


def test_host_tensors_stay_as_they_are_on_a_cpu():
    t = torch.arange(4)
    copy = dev.HostCopy([t, None])
    assert copy.wait()[0] is t and copy.wait()[1] is None  # no copy, no event
    assert dev.to_device(t, CPU) is t and dev.pinned(t, CPU) is t
    assert not dev.enqueues_work(CPU) and dev.enqueues_work(torch.device("meta"))
    assert dev.in_host_memory(t) and not dev.in_host_memory(torch.empty(1, device="meta"))


def test_the_dtype_and_fp8_of_a_device(monkeypatch):
    assert dev.resolve_dtype("float16", CPU) == torch.float16
    assert dev.resolve_dtype("auto", CPU, quantized=True) == torch.float32
    cuda = torch.device("cuda")
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: False)
    assert dev.resolve_dtype("auto", cuda) == torch.float16
    assert dev.fp8_problem(CPU) is None and dev.fp8_emulated(CPU)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    assert "sm_80" in (dev.fp8_problem(cuda) or "") and not dev.fp8_emulated(cuda)
    assert not dev.builds_on_host(cuda) and dev.builds_on_host(CPU)
    assert dev.runs_cpu_kernels(CPU) and not dev.runs_cpu_kernels(cuda)


def test_tensor_parallel_ranks_talk_by_their_device_kind():
    assert (dev.collective_backend("cuda"), dev.collective_backend("cpu")) == ("nccl", "gloo")
    assert dev.rank_device("cpu", 3) == CPU
    assert dev.device_kind("cpu") == "cpu"
    # gloo sums half types in float32 (it has no bfloat16 sum); NCCL as they are
    assert dev.reduce_dtype("gloo", torch.bfloat16) == torch.float32
    assert dev.reduce_dtype("gloo", torch.float16) == torch.float32
    assert dev.reduce_dtype("gloo", torch.int64) == torch.int64
    assert dev.reduce_dtype("nccl", torch.bfloat16) == torch.bfloat16


def test_a_cpu_backend_names_its_place_and_has_no_cache_to_give_back():
    backend = CpuBackend(torch.float32, 16, None, StepRows())
    assert backend.placement(2) == ("cpu", [])
    backend.release_cached_memory()  # nothing to give back: a no-op
    assert backend.host_ops_isa is None  # --kernels torch: the sampler's torch masks
    if kernels_built():
        with_kernels = CpuBackend(torch.float32, 16, "avx2", StepRows())  # index 1, not 0
        assert with_kernels.host_ops_isa == kernels.isa_index("avx2") == 1


def test_a_gpu_backend_names_its_gpu_and_gives_back_its_cache(monkeypatch):
    pytest.importorskip("triton")
    from scheduler_worker.backends.cuda import CudaBackend

    backend = CudaBackend(
        torch.float32, 16, num_kv_heads=2, max_num_seqs=4, max_num_batched_tokens=64,
        max_model_len=128, gpu_memory_utilization=0.9, enforce_eager=True, device=CPU,
    )  # fmt: skip
    assert backend.placement() == ("cpu", [])  # the tests' stand-in device
    assert backend.host_ops_isa is None  # no C++ kernels: the sampler's torch masks
    backend.device = torch.device("cuda", 1)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6")
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index: f"NVIDIA H200 #{index}")
    assert backend.placement(2) == ("NVIDIA H200 #1", ["5", "6"])
    emptied = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: emptied.append(1))
    backend.release_cached_memory()
    assert emptied == [1]
