"""zeroserve's C++ CPU kernels (csrc/): quantized linears, built once, picked at run time.

    csrc/**/*.cpp, *.h ──build()──▶ kernels/build/zeroserve_kernels-<key>.so ──load()──▶ torch.ops.zeroserve
                (g++, at install: `python -m scheduler_worker.kernels`; else on first use)

The key hashes the sources, torch's version and C++ ABI and the compiler flags, not the
compiler's path: a change to any of them builds a new library next to the old one, and a
library built elsewhere for the same key (in kernels/build/ or the user's cache) loads on a
machine without a compiler. A failed build leaves a marker (keyed like the library, with
the error) that later starts read instead of compiling again; `python -m
scheduler_worker.kernels --rebuild` retries. The build writes a temporary file and renames
it into place under an flock, so processes starting together build once. One build
serves every CPU kind: the code is compiled for baseline x86-64, the AVX2 and AVX-512
variants carry their own target attributes, and every op takes the path as an explicit
`isa` argument (csrc/zs_isa.h), chosen once by the caller; `best_isa()` is this CPU's best.

A machine with neither a compiler nor a prebuilt library (or with a failed build) still
serves: `load()` returns False, logs why once, and the model keeps its pure-torch path.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from functools import cache
from pathlib import Path

import torch

from common.config import ConfigError
from common.cpu import KERNEL_ISAS, best_kernel_isa, check_kernel_choice
from common.log import get_logger

log = get_logger("kernels")

CSRC = Path(__file__).parent / "csrc"
SOURCES = [
    CSRC / name
    for name in (
        "zs_isa.cpp",
        "zs_team.cpp",
        "quant/qlinear.cpp",
        "quant/generic/gemm.cpp",
        "quant/arch/avx2/gemm.cpp",
        "quant/arch/avx512/gemm.cpp",
        "quant/arch/amx/gemm.cpp",
        "decode_attention.cpp",
        "decode_ops.cpp",
        "decode_model.cpp",
        "sample_rows.cpp",
        "logprob_rows.cpp",
        "penalize_rows.cpp",
    )
]  # compiled, each on its own (in parallel); headers included
ISAS = KERNEL_ISAS  # index = the isa argument of the ops
CXXFLAGS = [
    "-O3",
    "-std=c++20",
    "-shared",
    "-fPIC",
    # OpenMP for at::parallel_for, which torch's headers implement inline with `omp
    # parallel` (its OpenMP build): -fopenmp-simd alone would leave every op on one
    # thread. The library's libgomp.so.1 resolves to the one torch ships and has loaded
    # (same soname, torch/lib on the rpath): one OpenMP runtime, tested.
    "-fopenmp",
    "-fno-math-errno",
    "-Wno-unused-function",
    "-DNDEBUG",
]


class KernelBuildError(RuntimeError):
    pass


def _compiler() -> str | None:
    return os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")


def _key() -> str:
    """What the library depends on: the sources and headers, torch's version and C++ ABI,
    the flags. Not the compiler's path, so a library built elsewhere serves a machine
    without one."""
    h = hashlib.sha256()
    for src in sorted(CSRC.rglob("*")):  # sources and headers, by their path under csrc/
        if src.suffix in (".cpp", ".h"):
            h.update(src.relative_to(CSRC).as_posix().encode() + src.read_bytes())
    h.update(f"{torch.__version__}|{' '.join(CXXFLAGS)}|{torch._C._GLIBCXX_USE_CXX11_ABI}".encode())
    return h.hexdigest()[:16]


def _package_build_dir() -> Path:
    return Path(__file__).parent / "build"


def _cache_build_dir() -> Path:
    from common.config import default_cache_dir

    return default_cache_dir() / "kernels"


def build_dir() -> Path:
    """Next to the sources when writable (an editable install: the repository), else the
    user's cache directory."""
    here = _package_build_dir()
    try:
        here.mkdir(exist_ok=True)
        if os.access(here, os.W_OK):
            return here
    except OSError:
        pass
    alt = _cache_build_dir()
    alt.mkdir(parents=True, exist_ok=True)
    return alt


def library_name() -> str:
    return f"zeroserve_kernels-{_key()}.so"


def library_path() -> Path:
    """Where this build's library is written."""
    return build_dir() / library_name()


def prebuilt() -> Path | None:
    """A library of this exact key already there (built here, or shipped beside the
    sources, or in the user's cache), whether or not a compiler is."""
    for d in (_package_build_dir(), _cache_build_dir()):
        if (d / library_name()).is_file():
            return d / library_name()
    return None


def failure_marker(lib: Path) -> Path:
    """Written when a build of `lib`'s key fails, with the compiler's error: later starts
    read it instead of compiling again (`python -m scheduler_worker.kernels --rebuild`)."""
    return lib.with_suffix(".failed")


def _check_no_failure(lib: Path) -> None:
    marker = failure_marker(lib)
    if marker.exists():
        first = next(iter(marker.read_text(errors="replace").strip().splitlines()), "")
        raise KernelBuildError(
            f"an earlier build of these sources failed ({first}; the error: {marker}); "
            "`python -m scheduler_worker.kernels --rebuild` tries again"
        )


def build(verbose: bool = False, force: bool = False) -> Path:
    """The library of these sources: one already there, else compiled now; returns its
    path. A failed build is remembered (failure_marker) and not retried unless `force`,
    which also recompiles a library that exists."""
    lib = library_path()
    if force:
        failure_marker(lib).unlink(missing_ok=True)
    else:
        found = prebuilt()
        if found is not None:
            return found
        _check_no_failure(lib)
    cxx = _compiler()
    if cxx is None:
        raise KernelBuildError(
            f"no C++ compiler found (g++ or $CXX) and no prebuilt {lib.name} "
            f"(in {_package_build_dir()} or {_cache_build_dir()})"
        )
    with open(lib.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not force:  # another process built it, or failed to, while we waited
            if lib.exists():
                return lib
            _check_no_failure(lib)
        t0 = time.perf_counter()
        fd, tmp = tempfile.mkstemp(dir=lib.parent, prefix=".build-", suffix=".so")
        os.close(fd)
        if verbose:
            print(f"compiling {len(SOURCES)} sources with {cxx}", file=sys.stderr)
        try:
            proc = _compile(cxx, Path(tmp), verbose)
            if proc.returncode != 0:
                err = f"{cxx} failed ({proc.returncode}):\n{proc.stderr[-4000:]}"
                failure_marker(lib).write_text(err)
                raise KernelBuildError(err)
            os.replace(tmp, lib)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        log.info("built CPU kernels in %.0fs: %s", time.perf_counter() - t0, lib)
    return lib


def _run(cmd: list[str], verbose: bool) -> subprocess.CompletedProcess[str]:
    if verbose:
        print(" ".join(cmd), file=sys.stderr)
    try:
        return subprocess.run(cmd, capture_output=True, text=True)
    except OSError as e:  # the compiler named by $CXX cannot be run
        return subprocess.CompletedProcess(cmd, 127, "", str(e))


def _compile(cxx: str, out: Path, verbose: bool) -> subprocess.CompletedProcess[str]:
    """Each source compiled to an object, as many at once as there are CPUs, then linked
    into `out`; the first failing command's result, else the link's."""
    from torch.utils import cpp_extension  # 0.1 s at each start: only to compile

    flags = [
        *CXXFLAGS,
        f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}",
        *(f"-I{p}" for p in cpp_extension.include_paths()),
    ]
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=".objects-") as objects:
        objs = [f"{objects}/{i}.o" for i in range(len(SOURCES))]
        cmds = [
            [cxx, *flags, "-c", str(src), "-o", obj] for src, obj in zip(SOURCES, objs, strict=True)
        ]
        with ThreadPoolExecutor(max_workers=max(1, min(len(cmds), os.cpu_count() or 1))) as pool:
            compiled = list(pool.map(lambda cmd: _run(cmd, verbose), cmds))
        failed = next((p for p in compiled if p.returncode != 0), None)
        if failed is not None:
            return failed
        libs = cpp_extension.library_paths()
        return _run(
            [
                cxx,
                *CXXFLAGS,
                *objs,
                "-o",
                str(out),
                *(f"-L{p}" for p in libs),
                *(f"-Wl,-rpath,{p}" for p in libs),
                "-lc10",
                "-ltorch_cpu",
            ],
            verbose,
        )


@cache
def load() -> bool:
    """Load (building first if needed) the kernels into torch.ops.zeroserve; False, with
    one warning, when they cannot be had here."""
    try:
        torch.ops.load_library(str(build()))
    except (KernelBuildError, OSError, RuntimeError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        log.warning(
            "CPU kernels unavailable (%s): quantized weights run dequantized in pure torch, slower",
            first,
        )
        return False
    return True


def best_isa() -> str:
    """The fastest kernel path this CPU runs: by its flags, and once the library is
    loaded, no faster than the C++ side finds (AMX needs the OS's permission too)."""
    flagged = best_kernel_isa()
    if not load():
        return flagged
    return ISAS[min(ISAS.index(flagged), int(torch.ops.zeroserve.cpu_isa()))]


def isa_index(name: str) -> int:
    if name not in ISAS:
        raise ValueError(f"kernel ISA must be one of {ISAS}, got {name!r}")
    return ISAS.index(name)


def kernel_path(choice: str) -> str | None:
    """The one ISA path (ISAS) every C++ op takes for --kernels `choice`: the best
    this CPU has (as ZEROSERVE_CPU_KIND presents it) for auto, None for pure torch."""
    if choice == "torch":
        return None
    if not load():  # logs why, once
        if choice != "auto":
            raise ConfigError(
                f"--kernels {choice}: the C++ kernels are not available here (see the log)"
            )
        return None
    if choice == "auto":
        return best_isa()
    check_kernel_choice(choice)  # by the CPU's flags
    best = best_isa()  # by the C++ side: AMX needs the OS's permission too
    if isa_index(choice) > isa_index(best):
        raise ConfigError(
            f"--kernels {choice}: the kernels run {best} at best here (the OS refused "
            "the AMX tile permission: Linux 5.16 or later grants it)"
        )
    return choice
