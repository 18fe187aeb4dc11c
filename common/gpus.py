"""Which GPUs each scheduler replica runs on: launch.py places them, a replica names its own.

    visible GPUs     ZEROSERVE_STANDIN_GPU_COUNT (tests), else CUDA_VISIBLE_DEVICES's
                     entries, else `nvidia-smi -L`, else /proc/driver/nvidia/gpus
      └─ --gpu-ids   indexes into them (default: all, in order): the pool
           └─ replica K: pool[K*T : K*T+T]   (T GPUs a replica: 1 until tensor
                                              parallelism, issue 57 item 2)

launch.py sets CUDA_VISIBLE_DEVICES to replica K's GPUs in that child's environment
before it starts, as vLLM and SGLang isolate their workers: inside the replica,
torch.device("cuda") is its own GPU (cuda:0), so no device index travels through the
config or the backend, and the CUDA context of one replica never lands on another's GPU.
A restarted replica is spawned with the same environment, so it keeps its GPU.
A replica started by hand (systemd, Kubernetes) names the GPUs its own environment gives.

Counted without torch: launch.py stays torch-free, so a refusal (more GPUs asked for than
are visible) is one line before anything starts. The count is CUDA's: GPUs, not MIG
slices (a MIG slice is named by its UUID in CUDA_VISIBLE_DEVICES, which is then the list).
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from common.config import Config, ConfigError, parse_gpu_ids
from common.env import cuda_visible_devices, standin_gpu_count
from common.torch_build import TorchBuild

NVIDIA_GPUS = Path("/proc/driver/nvidia/gpus")  # one folder per GPU (its PCI address)
_NVIDIA_SMI_GPU = re.compile(r"^GPU \d+:", re.MULTILINE)  # MIG lines are indented


def visible_gpus() -> list[str] | None:
    """The GPUs this process may hand out, by the id CUDA_VISIBLE_DEVICES takes ("0", or a
    UUID where the environment lists UUIDs); None when nothing can tell."""
    try:
        standin = standin_gpu_count()
    except ValueError as e:
        raise ConfigError(str(e)) from None
    if standin is not None:
        return [str(i) for i in range(standin)]
    listed = cuda_visible_devices()
    if listed is not None:
        return listed
    count = _nvidia_smi_count()
    if count is None and NVIDIA_GPUS.is_dir():
        count = sum(1 for _ in NVIDIA_GPUS.iterdir())
    return None if count is None else [str(i) for i in range(count)]


def _nvidia_smi_count() -> int | None:
    try:
        run = subprocess.run(
            ["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.TimeoutExpired):  # not installed, or hung on a bad driver
        return None
    return len(_NVIDIA_SMI_GPU.findall(run.stdout)) if run.returncode == 0 else None


def replica_gpus(replica: int, per_replica: int, pool: list[str]) -> list[str]:
    """Replica K's GPUs: K*T .. K*T+T-1 of the pool (T = per_replica)."""
    return pool[replica * per_replica : (replica + 1) * per_replica]


def _named(gpus: list[str]) -> str:
    return ", ".join(gpus) if gpus else "none"


def place_replicas(
    num_replicas: int, per_replica: int, visible: list[str] | None, gpu_ids: str | None
) -> list[list[str]]:
    """Each replica's GPUs (CUDA_VISIBLE_DEVICES entries), or a one-line ConfigError when
    the pool is too small or --gpu-ids names a GPU that is not visible. With `visible`
    None (nothing could count them) the GPUs are taken at their index, unchecked: the
    replica whose GPU is missing then refuses to start (scheduler_worker/loader.py)."""
    need = num_replicas * per_replica
    ids = parse_gpu_ids(gpu_ids) if gpu_ids is not None else None
    if visible is not None and ids is not None and (bad := [i for i in ids if i >= len(visible)]):
        raise ConfigError(
            f"--gpu-ids {gpu_ids}: GPU {bad[0]} is not visible "
            f"({len(visible)} GPU(s) visible: {_named(visible)})"
        )
    if ids is not None:
        pool = [visible[i] if visible is not None else str(i) for i in ids]
    else:
        pool = visible if visible is not None else [str(i) for i in range(need)]
    if len(pool) < need:
        given = f"--gpu-ids {gpu_ids} gives {len(pool)}" if ids else f"{len(pool)} visible"
        raise ConfigError(
            f"--data-parallel-size {num_replicas} needs {need} GPU(s) ({per_replica} per "
            f"replica); {given} ({_named(pool)})"
        )
    return [replica_gpus(k, per_replica, pool) for k in range(num_replicas)]


def replica_environment(gpus: list[str]) -> dict[str, str]:
    """A replica's environment: this one's, its GPUs alone visible."""
    return {**os.environ, "CUDA_VISIBLE_DEVICES": ",".join(gpus)}


def own_gpus(device_index: int) -> list[str]:
    """The id of the GPU a replica runs on (its torch device's index), as its launcher
    named it: the CUDA_VISIBLE_DEVICES entry at that index, else the index itself."""
    listed = cuda_visible_devices()
    if listed is None or device_index >= len(listed):
        return [str(device_index)]
    return [listed[device_index]]


def plan_gpus(config: Config, build: TorchBuild | None) -> list[list[str]] | None:
    """launch.py's placement: each replica's GPUs when the replicas run on GPUs
    (--device cuda, or auto with a GPU build of torch and a GPU visible), else None.
    --gpu-ids with replicas on the CPU is refused, as a flag that would do nothing."""
    device = config.engine.model.device
    gpu_build = build is None or build.has_gpu_support
    visible = visible_gpus() if device == "cuda" or (device == "auto" and gpu_build) else None
    if device == "cuda" or (device == "auto" and gpu_build and visible):
        n, per = config.data_parallel_size, config.gpus_per_replica
        return place_replicas(n, per, visible, config.gpu_ids)
    if config.gpu_ids is not None:
        raise ConfigError(
            f"--gpu-ids {config.gpu_ids}: the replicas run on the CPU here (--device "
            f"{device}); --device cuda places them on GPUs"
        )
    return None
