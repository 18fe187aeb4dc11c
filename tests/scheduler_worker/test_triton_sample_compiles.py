"""The sampler's Triton kernel (backends/triton_sample.py) compiled for an H100 / H200
(sm_90) without a GPU: Triton's own compiler down to a cubin with the ptxas its wheel
ships. The interpreter (test_sample_rows.py) runs the kernel's logic but not its
compilation: a loop-carried value that changes type, an op the GPU backend lacks, or a
spill to local memory shows only here, or on a GPU. Both variants: the uniforms given, and
keyed (the one CudaBackend declares)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

triton = pytest.importorskip("triton")
BIN = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
pytestmark = pytest.mark.skipif(
    not (BIN / "ptxas").exists() or not (BIN / "cuobjdump").exists(),
    reason="Triton's NVIDIA backend tools (ptxas, cuobjdump) are not installed",
)
ROOT = Path(__file__).resolve().parents[2]

# run in a process of its own: the test session interprets the kernels (TRITON_INTERPRET),
# so its kernel objects cannot be compiled
SCRIPT = r"""
import json, subprocess, sys, tempfile
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from scheduler_worker.backends import triton_sample as T

out = {}
for keyed in (False, True):
    sig = {"x_ptr": "*fp32", "stride_x": "i32", "draw_ptr": "*i64", "prm_ptr": "*fp64",
           "u_ptr": "*i64" if keyed else "*fp32", "stride_u": "i32", "cand_ptr": "*fp32",
           "out_ptr": "*i64", "V": "i32", "NB": "i32", "CAP": "constexpr",
           "TILE": "constexpr", "RB": "constexpr", "KEYED": "constexpr"}
    consts = {"CAP": T.CAP, "TILE": T.TILE, "RB": T.RACE, "KEYED": keyed}
    src = ASTSource(fn=T._sample_rows_kernel, signature=sig, constexprs=consts)
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": T.NUM_WARPS})
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(k.asm["cubin"])
        f.flush()
        usage = subprocess.run([sys.argv[1], "--dump-resource-usage", f.name],
                               capture_output=True, text=True, check=True).stdout
    out[str(keyed)] = [line.strip() for line in usage.splitlines() if "REG:" in line]
print(json.dumps(out))
"""


def test_the_sampler_kernel_compiles_for_sm90_without_spills(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "triton-cache")  # compiled here, not reused
    env["TRITON_DEFAULT_FP_FUSION"] = "1"  # Triton 3.9's default, said (it warns otherwise)
    run = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(BIN / "cuobjdump")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    usage = json.loads(run.stdout.strip().splitlines()[-1])
    for keyed, lines in usage.items():
        assert lines, f"keyed={keyed}: no resource usage in the cubin"
        fields = dict(f.split(":") for f in lines[0].split() if ":" in f)
        assert fields["LOCAL"] == "0", f"keyed={keyed} spills to local memory: {lines[0]}"
        assert int(fields["REG"]) <= 255, lines[0]
