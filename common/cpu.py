"""What the CPU can do, read once from /proc/cpuinfo (Linux): the one CPU-flag probe.

Torch-free: the engine picks kernels and dtypes from these flags, the benchmarks print them.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path


@cache
def _cpuinfo() -> str:
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""


def _first(key: str) -> str:
    for line in _cpuinfo().splitlines():
        name, _, value = line.partition(":")
        if name.strip() == key:
            return value.strip()
    return ""


@cache
def cpu_flags() -> frozenset[str]:
    """The first processor's feature flags (avx2, avx512f, avx512_bf16, amx_bf16, ...)."""
    return frozenset(_first("flags").split())


def cpu_model_name() -> str:
    return _first("model name") or "unknown CPU"


def cpu_kind() -> str:
    """A short name for the kernel-relevant kind: amx, avx512, avx2 or baseline."""
    flags = cpu_flags()
    if "amx_bf16" in flags:
        return "amx"
    if "avx512f" in flags:
        return "avx512"
    return "avx2" if "avx2" in flags else "baseline"
