"""The sampler's Triton kernels (backends/triton_sample.py, triton_penalties.py's and
triton_masks.py's) compiled for an H100 / H200 (sm_90) without a GPU, the draw's two
variants (the uniforms given, and keyed: the one CudaBackend declares), through
benchmarks/compile_sm90.py: its tests run with the kernel compiled by Triton's own compiler and the ptxas its wheel ships, no launch, and each cubin's resource
usage read. The interpreter (test_sample_rows.py) runs the kernel's logic but never
compiles it: a loop-carried value that changes type, an op the GPU backend lacks, or a
spill to local memory shows only here, or on a GPU."""

from __future__ import annotations

import re
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
NODES = [
    "tests/scheduler_worker/test_sample_rows.py::test_the_keyed_kernel_makes_the_uniforms_seeded_uniforms_makes",
    "tests/scheduler_worker/test_sample_rows.py::test_argmax_rows_pick_what_torch_picks",
    "tests/scheduler_worker/test_penalty_counts.py::test_kept_counts_give_the_per_row_logits_bit_for_bit[cpu]",
    "tests/scheduler_worker/test_grammar_masks.py::test_token_masks_follow_the_bit_order",
]


def test_the_sampler_kernel_compiles_for_sm90_without_spills():
    run = subprocess.run(
        [sys.executable, "benchmarks/compile_sm90.py", *NODES],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout + run.stderr[-3000:]
    line = re.search(
        r"_sample_rows_kernel: (\d+) variant\(s\) compiled for sm_90, registers up to (\d+), "
        r"(\d+) spilling, (\d+) compile error",
        run.stdout,
    )
    assert line, run.stdout
    assert int(line[1]) >= 2  # keyed, and the uniforms given
    assert int(line[2]) <= 255 and line[3] == "0" and line[4] == "0"
    pen = re.search(
        r"_penalize_rows_kernel: (\d+) variant\(s\) compiled for sm_90, registers up to (\d+), "
        r"(\d+) spilling, (\d+) compile error",
        run.stdout,
    )
    assert pen and int(pen[1]) == 1, run.stdout  # one variant for every mix of terms
    assert int(pen[2]) <= 255 and pen[3] == "0" and pen[4] == "0"
    masks = re.search(
        r"_mask_rows_kernel: (\d+) variant\(s\) compiled for sm_90, registers up to (\d+), "
        r"(\d+) spilling, (\d+) compile error",
        run.stdout,
    )
    assert masks and int(masks[1]) == 2, run.stdout  # float32 and bfloat16 logits
    assert int(masks[2]) <= 255 and masks[3] == "0" and masks[4] == "0"
