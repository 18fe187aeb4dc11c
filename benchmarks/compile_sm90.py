"""Every Triton kernel compiled for an H100 / H200 (sm_90) on a machine without a GPU: the
kernel tests run with the kernels compiled instead of interpreted, a stand-in driver that
names sm_90 as the device, and each launch turned into a compile (Triton's warm-up: no
launch). What each compile gives is read from its cubin (cuobjdump, shipped in Triton's
wheel): registers a thread, local memory (a spill), shared memory. The tests' own
assertions fail (nothing ran, the outputs are garbage) and are not the point: a kernel
that does not compile, or spills, is.

    .venv/bin/python benchmarks/compile_sm90.py [pytest args: test files, -k ...]

Prints a line a kernel (its variants compiled, the most registers, spills, errors) and
exits 1 where a kernel failed to compile or spilled. Without arguments it runs the Triton
kernel tests (the layer ops, decode, prefill, GEMV, FP8, the sampler, its penalties, the
grammar masks). The interpreter
the tests otherwise use never compiles: a loop-carried value that changes type, or an op
the GPU backend lacks, shows only here or on a GPU.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = [
    "tests/scheduler_worker/test_triton_kernels.py",
    "tests/scheduler_worker/test_triton_gemv.py",
    "tests/scheduler_worker/test_triton_decode_splits.py",
    "tests/scheduler_worker/test_fp8.py",
    "tests/scheduler_worker/test_sample_rows.py::test_the_cut_is_the_torch_paths_token_for_token",
    "tests/scheduler_worker/test_sample_rows.py::test_the_keyed_kernel_makes_the_uniforms_seeded_uniforms_makes",
    "tests/scheduler_worker/test_penalty_counts.py::test_kept_counts_give_the_per_row_logits_bit_for_bit[cpu]",
    "tests/scheduler_worker/test_grammar_masks.py::test_token_masks_follow_the_bit_order",
]


def plugin() -> None:
    """Run inside pytest (-p benchmarks.compile_sm90, SM90_OUT set): the stand-in driver
    and the compiling launch; the results written at the session's end."""
    import torch
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.runtime import driver
    from triton.runtime.jit import JITFunction

    class StandInDriver:
        """What JITFunction.run asks of the active driver, for a compile without a GPU."""

        def get_current_device(self):
            return 0

        def get_current_stream(self, device=None):
            return 0

        def get_current_target(self):
            return GPUTarget("cuda", 90, 32)

        def get_device_interface(self):
            return torch.cuda

        def get_active_torch_device(self):
            return torch.device("cpu")

    driver.set_active(StandInDriver())
    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    seen: dict[str, list[str]] = {}
    launch = JITFunction.run

    def compile_only(self, *args, grid, warmup, **kwargs):
        name = self.fn.__name__
        try:
            kernel = launch(self, *args, grid=grid, warmup=True, **kwargs)
        except Exception as e:  # a compile error: recorded, and the test errors
            root: BaseException = e  # the innermost cause says why (the outer ones: where)
            while root.__cause__ is not None:
                root = root.__cause__
            why = getattr(root, "error_message", None) or repr(root)
            seen.setdefault(name, []).append(f"ERROR {str(why)[:300]}")
            raise
        with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
            f.write(kernel.asm["cubin"])
            f.flush()
            usage = subprocess.run(
                [str(tool), "--dump-resource-usage", f.name], capture_output=True, text=True
            ).stdout
        seen.setdefault(name, []).append(next((s for s in usage.split("\n") if "REG:" in s), "?"))
        return kernel

    JITFunction.run = compile_only
    out = os.environ["SM90_OUT"]

    import atexit

    atexit.register(lambda: Path(out).write_text(json.dumps(seen)))


def main() -> int:
    args = sys.argv[1:] or DEFAULT
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "sm90.json"
        env = {**os.environ, "TRITON_INTERPRET": "0", "SM90_OUT": str(out)}
        env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
        env["TRITON_CACHE_DIR"] = str(Path(tmp) / "cache")  # compiled now, not reused
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
        cmd += ["-p", "benchmarks.compile_sm90", "-o", "addopts=", *args]
        subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
        if not out.exists():
            print("no results: the tests did not run", file=sys.stderr)
            return 1
        seen = json.loads(out.read_text())
    bad = 0
    for name, lines in sorted(seen.items()):
        errors = [s for s in lines if s.startswith("ERROR")]
        usage = [dict(f.split(":") for f in s.split() if ":" in f) for s in lines if "REG:" in s]
        spills = [u for u in usage if u.get("LOCAL") != "0"]
        regs = max((int(u["REG"]) for u in usage), default=0)
        bad += bool(errors or spills)
        print(
            f"{name}: {len(usage)} variant(s) compiled for sm_90, registers up to {regs}, "
            f"{len(spills)} spilling, {len(errors)} compile error(s)"
            + "".join(f"\n    {e}" for e in errors[:3])
        )
    return 1 if bad or not seen else 0


if os.environ.get("SM90_OUT") and __name__ != "__main__":
    plugin()

if __name__ == "__main__":
    sys.exit(main())
