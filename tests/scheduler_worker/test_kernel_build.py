"""Building and finding the C++ kernels: a library keyed by what it is made of (not by
the compiler), loaded without a compiler when one of its key is there, a failed build
remembered instead of retried at every start, and CI failing when they do not build."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from scheduler_worker import kernels
from scheduler_worker.kernels.__main__ import main as kernels_main

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def dirs(tmp_path, monkeypatch):
    """The package's build dir and the user's cache dir, both empty, in tmp_path."""
    pkg, cache = tmp_path / "pkg", tmp_path / "cache"
    monkeypatch.setattr(kernels, "_package_build_dir", lambda: pkg)
    monkeypatch.setattr(kernels, "_cache_build_dir", lambda: cache)
    return pkg, cache


@pytest.fixture
def failing_compiler(tmp_path, monkeypatch):
    """A compiler that fails with an error and counts its runs (lines of calls.txt)."""
    calls = tmp_path / "calls.txt"
    cxx = tmp_path / "bad-g++"
    cxx.write_text(f"#!/bin/sh\necho run >> {calls}\necho 'error: no such header' >&2\nexit 1\n")
    cxx.chmod(0o755)
    monkeypatch.setattr(kernels, "_compiler", lambda: str(cxx))
    return lambda: len(calls.read_text().splitlines()) if calls.exists() else 0


def test_the_key_does_not_depend_on_the_compiler(monkeypatch):
    monkeypatch.setenv("CXX", "/opt/one/g++")
    key = kernels.library_name()
    monkeypatch.setenv("CXX", "/usr/local/other/clang++")
    assert kernels.library_name() == key
    monkeypatch.setattr(kernels, "CXXFLAGS", [*kernels.CXXFLAGS, "-DSOMETHING"])
    assert kernels.library_name() != key  # flags do count


def test_without_a_compiler_a_library_of_the_key_is_used(dirs, monkeypatch):
    pkg, cache = dirs
    monkeypatch.setattr(kernels, "_compiler", lambda: None)
    with pytest.raises(kernels.KernelBuildError, match="no C.. compiler found .* no prebuilt"):
        kernels.build()
    cache.mkdir(exist_ok=True)
    (cache / "zeroserve_kernels-0123456789abcdef.so").write_bytes(b"other sources")
    with pytest.raises(kernels.KernelBuildError, match="no prebuilt"):
        kernels.build()  # a library of another key is not taken
    lib = cache / kernels.library_name()
    lib.write_bytes(b"prebuilt")
    assert kernels.build() == lib
    pkg.mkdir(exist_ok=True)
    (pkg / kernels.library_name()).write_bytes(b"shipped beside the sources")
    assert kernels.build() == pkg / kernels.library_name()  # the package's own first


@pytest.mark.skipif(not kernels.load(), reason="the C++ kernels are not built here")
def test_a_prebuilt_library_loads_in_a_process_without_a_compiler(tmp_path):
    """End to end, in a fresh process with no compiler on PATH and no $CXX: the library
    built here, copied into an otherwise empty cache directory, is found and loaded."""
    cache = tmp_path / "cache" / "kernels"
    cache.mkdir(parents=True)
    shutil.copy(kernels.prebuilt() or kernels.library_path(), cache / kernels.library_name())
    script = (
        "import sys, pathlib, torch\n"
        "from scheduler_worker import kernels\n"
        "kernels._package_build_dir = lambda: pathlib.Path(sys.argv[1])\n"
        "assert kernels._compiler() is None, kernels._compiler()\n"
        "assert kernels.load()\n"
        "print(kernels.prebuilt(), torch.ops.zeroserve.cpu_isa())\n"
    )
    env = {
        "PATH": str(tmp_path / "empty-bin"),
        "PYTHONPATH": str(ROOT),
        "ZEROSERVE_CACHE_DIR": str(tmp_path / "cache"),
        "HOME": str(tmp_path),
    }
    out = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "no-pkg-build")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.startswith(str(cache / kernels.library_name()))


def test_a_failed_build_is_remembered_not_retried(dirs, failing_compiler, capsys):
    with pytest.raises(kernels.KernelBuildError, match="no such header"):
        kernels.build()
    per_build = len(kernels.SOURCES)  # one compiler run per source, all tried
    assert failing_compiler() == per_build
    marker = kernels.failure_marker(kernels.library_path())
    assert marker.name == kernels.library_name().replace(".so", ".failed")
    assert "no such header" in marker.read_text()
    for _ in range(3):  # later starts read the marker
        with pytest.raises(kernels.KernelBuildError, match="earlier build .* failed.*--rebuild"):
            kernels.build()
    assert failing_compiler() == per_build
    # install: not fatal, not rerun
    assert kernels_main([]) == 0 and failing_compiler() == per_build
    assert kernels_main(["--require"]) == 1 and failing_compiler() == per_build
    # forced: compiled
    assert kernels_main(["--rebuild"]) == 0 and failing_compiler() == 2 * per_build
    assert kernels_main(["--rebuild", "--require"]) == 1 and failing_compiler() == 3 * per_build
    assert "CPU kernels not built" in capsys.readouterr().err
    assert marker.exists() and not kernels.library_path().exists()


def test_makefile_requires_the_kernels_under_ci():
    text = (ROOT / "Makefile").read_text()
    assert "-m scheduler_worker.kernels $(if $(filter true 1 yes,$(CI)),--require,)" in text
    dry = subprocess.run(
        ["make", "-n", "-B", "install", "CI=true", "PY=python"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    if dry.returncode != 0:
        pytest.skip(f"make -n failed here: {dry.stderr[-300:]}")
    assert "-m scheduler_worker.kernels --require" in dry.stdout


@pytest.mark.skipif(not os.environ.get("CI"), reason="CI only: a machine may lack a compiler")
def test_the_kernels_build_under_ci():
    assert kernels.load(), "CI: the C++ kernels did not build (see the log above)"


@pytest.mark.skipif(not kernels.load(), reason="the C++ kernels are not built here")
def test_one_openmp_runtime_in_the_process():
    """The library's OpenMP (at::parallel_for) is torch's own libgomp, not a second one."""
    assert torch.ops.zeroserve.cpu_isa() >= 0
    maps = Path("/proc/self/maps")
    if not maps.exists():
        pytest.skip("no /proc here")
    gomp = {line.split()[-1] for line in maps.read_text().splitlines() if "libgomp" in line}
    assert len(gomp) <= 1, gomp
