"""zeroserve's C++ CPU kernels (csrc/): quantized linears, built once, picked at run time.

    csrc/*.cpp, *.h ──build()──▶ kernels/build/zeroserve_kernels-<key>.so ──load()──▶ torch.ops.zeroserve
                (g++, at install: `python -m scheduler_worker.kernels`; else on first use)

The key hashes the sources, torch's version and the compiler flags, so a change to any of
them builds a new library next to the old one. The build writes a temporary file and
renames it into place under an flock, so processes starting together build once. One
build serves every CPU kind: the code is compiled for baseline x86-64, and the AVX2 and
AVX-512 paths carry their own target attributes; `isa()` says which path a call takes.

A machine without a compiler (or a failed build) still serves: `load()` returns False,
logs why once, and the model keeps its pure-torch path (dequantized weights).
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
from functools import cache
from pathlib import Path

import torch

from common.cpu import KERNEL_ISAS, best_kernel_isa
from common.log import get_logger

log = get_logger("kernels")

CSRC = Path(__file__).parent / "csrc"
SOURCES = [
    CSRC / name
    for name in (
        "qgemm.cpp",
        "qgemm_kquant.cpp",
        "decode_attention.cpp",
        "decode_ops.cpp",
        "decode_model.cpp",
    )
]  # compiled; headers included
ISAS = KERNEL_ISAS  # index = the isa argument of the ops
CXXFLAGS = [
    "-O3",
    "-std=c++20",
    "-shared",
    "-fPIC",
    "-fopenmp",
    "-fno-math-errno",
    "-Wno-unused-function",
    "-DNDEBUG",
]


class KernelBuildError(RuntimeError):
    pass


def _compiler() -> str | None:
    return os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")


def _key(cxx: str) -> str:
    h = hashlib.sha256()
    for src in sorted(CSRC.iterdir()):  # sources and headers
        if src.suffix in (".cpp", ".h"):
            h.update(src.name.encode() + src.read_bytes())
    h.update(
        f"{torch.__version__}|{cxx}|{' '.join(CXXFLAGS)}|{torch._C._GLIBCXX_USE_CXX11_ABI}".encode()
    )
    return h.hexdigest()[:16]


def build_dir() -> Path:
    """Next to the sources when writable (an editable install: the repository), else the
    user's cache directory."""
    here = Path(__file__).parent / "build"
    try:
        here.mkdir(exist_ok=True)
        if os.access(here, os.W_OK):
            return here
    except OSError:
        pass
    from common.config import default_cache_dir

    alt = default_cache_dir() / "kernels"
    alt.mkdir(parents=True, exist_ok=True)
    return alt


def library_path() -> Path:
    cxx = _compiler()
    if cxx is None:
        raise KernelBuildError("no C++ compiler found (g++ or $CXX)")
    return build_dir() / f"zeroserve_kernels-{_key(cxx)}.so"


def build(verbose: bool = False) -> Path:
    """Compile the kernels unless this exact build exists; returns the library's path."""
    from torch.utils import cpp_extension

    lib = library_path()
    if lib.exists():
        return lib
    cxx = _compiler()
    assert cxx is not None  # library_path() checked
    with open(lib.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if lib.exists():  # another process built it while we waited
            return lib
        t0 = time.perf_counter()
        fd, tmp = tempfile.mkstemp(dir=lib.parent, prefix=".build-", suffix=".so")
        os.close(fd)
        abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
        cmd = [
            cxx,
            *CXXFLAGS,
            f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
            *(f"-I{p}" for p in cpp_extension.include_paths()),
            *map(str, SOURCES),
            "-o",
            tmp,
            *(f"-L{p}" for p in cpp_extension.library_paths()),
            *(f"-Wl,-rpath,{p}" for p in cpp_extension.library_paths()),
            "-lc10",
            "-ltorch_cpu",
        ]
        if verbose:
            print(" ".join(cmd), file=sys.stderr)
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode != 0:
                raise KernelBuildError(f"{cxx} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
            os.replace(tmp, lib)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        log.info("built CPU kernels in %.0fs: %s", time.perf_counter() - t0, lib)
    return lib


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
    """The fastest kernel path this CPU runs (from its flags; the C++ side re-checks)."""
    return best_kernel_isa()


def isa_index(name: str) -> int:
    if name not in ISAS:
        raise ValueError(f"kernel ISA must be one of {ISAS}, got {name!r}")
    return ISAS.index(name)
