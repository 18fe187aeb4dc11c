"""common.cpu: ZEROSERVE_CPU_KIND=avx2 makes every choice taken from the CPU's flags the
one an AVX2-only CPU gets (how the AVX2 path is measured on a newer machine)."""

from __future__ import annotations

import pytest

from common import cpu
from common.config import ConfigError


@pytest.fixture
def flags(monkeypatch):
    """Pretend /proc/cpuinfo says `line`; the caches are cleared around each use."""

    def set_flags(line: str, kind: str | None = None) -> None:
        monkeypatch.setattr(cpu, "_cpuinfo", lambda: f"processor : 0\nflags : {line}\n")
        if kind is None:
            monkeypatch.delenv("ZEROSERVE_CPU_KIND", raising=False)
        else:
            monkeypatch.setenv("ZEROSERVE_CPU_KIND", kind)
        cpu.cpu_flags.cache_clear()

    yield set_flags
    cpu.cpu_flags.cache_clear()


ZEN4 = "sse2 avx avx2 fma f16c avx512f avx512bw avx512vl avx512dq avx512_vnni avx512_bf16"
SAPPHIRE_RAPIDS = ZEN4 + " amx_bf16 amx_int8 amx_tile avx_vnni"


@pytest.mark.parametrize("line, best", [(ZEN4, "avx512"), (SAPPHIRE_RAPIDS, "amx")])
def test_avx2_kind_hides_what_an_avx2_cpu_lacks(flags, line, best):
    flags(line)
    assert cpu.best_kernel_isa() == best and cpu.has_native_bf16()
    flags(line, "AVX2")
    assert cpu.cpu_kind() == "avx2" and cpu.best_kernel_isa() == "avx2"
    assert not cpu.has_native_bf16()
    assert cpu.cpu_flags() == frozenset(["sse2", "avx", "avx2", "fma", "f16c"])


def test_a_kind_that_cannot_be_had_is_refused(flags):
    flags("sse2 avx", "avx2")
    with pytest.raises(ConfigError, match="no AVX2"):
        cpu.cpu_flags()
    flags(ZEN4, "avx512")
    with pytest.raises(ConfigError, match="must be avx2"):
        cpu.cpu_flags()


def test_an_emulated_kind_says_so_in_its_label(flags):
    flags(ZEN4)
    assert cpu.cpu_kind_label() == "avx512"
    flags(ZEN4, "avx2")
    assert cpu.cpu_kind() == "avx2" and cpu.cpu_kind_label() == "avx2 (emulated on avx512)"
    assert cpu.native_cpu_kind() == "avx512"
    flags(SAPPHIRE_RAPIDS, "avx2")
    assert cpu.cpu_kind_label() == "avx2 (emulated on amx)"
