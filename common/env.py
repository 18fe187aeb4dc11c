"""The environment: every variable zeroserve reads is read here, and nowhere else.

    ZEROSERVE_LOG_LEVEL         level of every process's log (INFO)
    ZEROSERVE_API_KEY           server.api_key when the config sets none (kept off `ps`)
    ZEROSERVE_SECRET            ipc.secret when the config sets none (a Kubernetes Secret)
    ZEROSERVE_CACHE_DIR         GGUF conversions and built kernels (~/.cache/zeroserve)
    ZEROSERVE_RUN_DIR           the ipc run dir when the config sets none
    ZEROSERVE_DECODE_ATTENTION  force a decode attention path (scheduler_worker/attention.py)
    ZEROSERVE_CPU_KIND          "avx2": choose kernels, dtype and dense copies as on an
                                AVX2-only CPU (common/cpu.py; for measuring that path on a
                                newer CPU, docs/benchmarks.md)
    ZEROSERVE_STANDIN_GPU_COUNT  launch.py counts this many GPUs instead of the machine's
                                (tests of replica placement on a CPU; common/gpus.py)
    CUDA_VISIBLE_DEVICES        the GPUs this process may use; launch.py sets it for
                                each GPU replica (common/gpus.py)
    RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, LOCAL_RANK   torchrun's: a scheduler
                                process's place among a replica's tensor-parallel ranks
                                (scheduler_worker/parallel/ranks.py; rank 0 sets them for
                                the ranks it starts itself)
    LWS_GROUP_SIZE, LWS_WORKER_INDEX, LWS_LEADER_ADDRESS   a Kubernetes LeaderWorkerSet
                                pod's (without WORLD_SIZE): the same place, one rank a pod
                                (deploy/kubernetes-multihost)
    XDG_CACHE_HOME, XDG_RUNTIME_DIR   the usual base directories, when set
    TRITON_CACHE_DIR, TORCHINDUCTOR_CACHE_DIR   where compiled kernels are kept; the
                                scheduler points them under the cache dir when unset
                                (use_compile_caches)
    OMP_WAIT_POLICY, GOMP_SPINCOUNT   how long an idle OpenMP thread spins before it
                                sleeps; launch.py sets GOMP_SPINCOUNT for its children
                                when neither is set (shorter_openmp_spins)

Child processes get the environment as it is (subprocess copies it); that is not a read.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

ENV_PREFIX = "ZEROSERVE_"


def env(name: str, default: str | None = None) -> str | None:
    """ZEROSERVE_<name>, or `default` when unset."""
    return os.environ.get(ENV_PREFIX + name, default)


def log_level() -> str:
    return (env("LOG_LEVEL", "INFO") or "").upper()


def runtime_dir() -> str | None:
    """$XDG_RUNTIME_DIR (per-user, private, cleared at logout), or None when unset."""
    return os.environ.get("XDG_RUNTIME_DIR") or None


def default_cache_dir() -> Path:
    explicit = env("CACHE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "zeroserve"


def cpu_kind_override() -> str | None:
    """ZEROSERVE_CPU_KIND, lower-cased, or None when unset or empty."""
    return (env("CPU_KIND") or "").strip().lower() or None


def standin_gpu_count() -> int | None:
    """ZEROSERVE_STANDIN_GPU_COUNT as an integer >= 0, or None when unset or empty."""
    text = (env("STANDIN_GPU_COUNT") or "").strip()
    if not text:
        return None
    if not text.isdigit():
        raise ValueError(f"ZEROSERVE_STANDIN_GPU_COUNT must be an integer >= 0, got {text!r}")
    return int(text)


def cuda_visible_devices() -> list[str] | None:
    """CUDA_VISIBLE_DEVICES's entries (indexes or UUIDs), or None when unset. As CUDA reads
    it, the list ends at the first entry that is not a device ("-1", "")."""
    text = os.environ.get("CUDA_VISIBLE_DEVICES")
    if text is None:
        return None
    out = []
    for entry in (e.strip() for e in text.split(",")):
        if not entry or entry.startswith("-"):
            break
        out.append(entry)
    return out


@dataclass(frozen=True)
class LaunchedRank:
    """A scheduler process's place among its replica's ranks, as its launcher gave it:
    torchrun (whose agent hosts the rendezvous store: `agent_store`), or a LeaderWorkerSet
    pod (rank 0's process hosts it at master_addr:master_port)."""

    rank: int
    world: int
    master_addr: str
    master_port: int
    local_rank: int
    agent_store: bool
    launcher: str  # "torchrun" or "LeaderWorkerSet": named in errors


def launched_rank() -> LaunchedRank | None:
    """torchrun's RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, LOCAL_RANK (RANK 0, port
    29500, LOCAL_RANK = RANK where unset); else, where WORLD_SIZE is unset, a LeaderWorkerSet
    pod's LWS_WORKER_INDEX, LWS_GROUP_SIZE and LWS_LEADER_ADDRESS (one rank a pod: LOCAL_RANK
    0 unless set; MASTER_PORT as above); None when neither is there. ValueError naming a
    variable that is not a number, or a missing leader address."""

    def number(name: str, default: str) -> int:
        text = (os.environ.get(name) or default).strip()
        if not text.isdigit():
            raise ValueError(f"{name} must be an integer >= 0, got {text!r}")
        return int(text)

    port = number("MASTER_PORT", "29500")
    if os.environ.get("WORLD_SIZE"):
        rank, world = number("RANK", "0"), number("WORLD_SIZE", "1")
        addr = os.environ.get("MASTER_ADDR") or "127.0.0.1"
        local = number("LOCAL_RANK", str(rank))
        launched = LaunchedRank(rank, world, addr, port, local, True, "torchrun")
    elif os.environ.get("LWS_GROUP_SIZE"):
        rank, world = number("LWS_WORKER_INDEX", "0"), number("LWS_GROUP_SIZE", "1")
        addr = (os.environ.get("LWS_LEADER_ADDRESS") or "").strip()
        if not addr:
            raise ValueError("LWS_GROUP_SIZE is set but LWS_LEADER_ADDRESS is not")
        local = number("LOCAL_RANK", "0")
        launched = LaunchedRank(rank, world, addr, port, local, False, "LeaderWorkerSet")
    else:
        return None
    if launched.world < 1:
        raise ValueError(f"the group size must be at least 1 ({launched.launcher})")
    return launched


# the compilers' own cache variables, and their folders under zeroserve's cache dir
COMPILE_CACHES = {"TRITON_CACHE_DIR": "triton", "TORCHINDUCTOR_CACHE_DIR": "inductor"}


def use_compile_caches(cache_dir: Path) -> dict[str, str]:
    """Point Triton's and torch inductor's kernel caches under `cache_dir` (the one a user
    sets, ZEROSERVE_CACHE_DIR or the config's cache_dir), where the user has not set them:
    compiled kernels then outlive a restart wherever the model cache does (a volume, not a
    container's home). Call before anything compiles. Returns each variable's value."""
    for name, sub in COMPILE_CACHES.items():
        if not os.environ.get(name):
            os.environ[name] = str(Path(cache_dir).expanduser().absolute() / sub)
    return {name: os.environ[name] for name in COMPILE_CACHES}


# libgomp spins this many turns (~25 ns each on the Xeon of docs/benchmarks.md) before an
# idle thread sleeps, against its own 300,000 (~7 ms): long enough for the gaps between a
# step's ops, short enough that torch's idle threads free their CPUs between steps for the
# frontend, the detokenizer and the tokenizers ("Served and in-process at 8 streams (issue
# 56), eleventh session")
OPENMP_SPINCOUNT = "10000"


def shorter_openmp_spins() -> str | None:
    """Set GOMP_SPINCOUNT for the processes started after this call (libgomp reads it as
    torch loads), unless the user set it or OMP_WAIT_POLICY. Returns what it set, or None."""
    if os.environ.get("GOMP_SPINCOUNT") or os.environ.get("OMP_WAIT_POLICY"):
        return None
    os.environ["GOMP_SPINCOUNT"] = OPENMP_SPINCOUNT
    return OPENMP_SPINCOUNT
