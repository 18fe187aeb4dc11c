"""What the CPU can do, read once from /proc/cpuinfo (Linux): the one CPU-flag probe.

Torch-free: the engine picks kernels and dtypes from these flags, the benchmarks print them.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

from common.config import ConfigError
from common.env import cpu_kind_override


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


# what ZEROSERVE_CPU_KIND=avx2 hides: the flags an AVX2-only CPU (AMD Zen 2/3) lacks
NEWER_THAN_AVX2 = ("avx512", "amx", "avx_vnni")


@cache
def cpu_flags() -> frozenset[str]:
    """The first processor's feature flags (avx2, avx512f, avx512_bf16, amx_bf16, ...).
    With ZEROSERVE_CPU_KIND=avx2, those of an AVX2-only CPU: every choice made from them
    (kernel path, dtype, dense copies) is then that CPU's, for measuring it on a newer one."""
    flags = frozenset(_first("flags").split())
    kind = cpu_kind_override()
    if kind is None:
        return flags
    if kind != "avx2":
        raise ConfigError(f"ZEROSERVE_CPU_KIND must be avx2 (or unset), got {kind!r}")
    if "avx2" not in flags:
        raise ConfigError("ZEROSERVE_CPU_KIND=avx2, but this CPU has no AVX2")
    return frozenset(f for f in flags if not f.startswith(NEWER_THAN_AVX2))


def cpu_model_name() -> str:
    return _first("model name") or "unknown CPU"


def has_native_bf16() -> bool:
    """bf16 matmuls in hardware (AVX512-BF16 or AMX): where bf16 GEMMs beat float32."""
    return bool({"avx512_bf16", "amx_bf16"} & cpu_flags())


def _kind_of(flags: frozenset[str]) -> str:
    if "amx_bf16" in flags:
        return "amx"
    if "avx512f" in flags:
        return "avx512"
    return "avx2" if "avx2" in flags else "baseline"


def cpu_kind() -> str:
    """A short name for the kernel-relevant kind: amx, avx512, avx2 or baseline (the
    emulated one under ZEROSERVE_CPU_KIND)."""
    return _kind_of(cpu_flags())


def native_cpu_kind() -> str:
    """The kind of the CPU itself, whatever ZEROSERVE_CPU_KIND presents."""
    return _kind_of(frozenset(_first("flags").split()))


def cpu_kind_label() -> str:
    """cpu_kind() for benchmark records and logs, saying when it is emulated:
    "avx2 (emulated on avx512)" under ZEROSERVE_CPU_KIND=avx2 on an AVX-512 machine."""
    kind = cpu_kind()
    if cpu_kind_override() is None:
        return kind
    return f"{kind} (emulated on {native_cpu_kind()})"


# scheduler_worker.kernels' paths, slowest first; "amx" is "avx512" with some linears on the
# tile unit (csrc/quant/arch/amx/amx.h)
KERNEL_ISAS = ("scalar", "avx2", "avx512", "amx")


def best_kernel_isa() -> str:
    """The fastest path of zeroserve's C++ kernels this CPU runs, by its flags (the C++
    side re-checks, and for AMX asks the OS: scheduler_worker.kernels.best_isa)."""
    flags = cpu_flags()
    if {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni"} <= flags:
        return "amx" if {"amx_tile", "amx_int8"} <= flags else "avx512"
    if {"avx2", "fma", "f16c"} <= flags:
        return "avx2"
    return "scalar"


def check_kernel_choice(choice: str) -> None:
    """Refuse --kernels naming a path this CPU lacks (a ConfigError naming the best one)."""
    if choice in KERNEL_ISAS and KERNEL_ISAS.index(choice) > KERNEL_ISAS.index(best_kernel_isa()):
        raise ConfigError(f"--kernels {choice}: this CPU's best kernel path is {best_kernel_isa()}")
