"""The host's decode step in instructions: bench_host_step.py's engine (overlapped, the
forward a graph's staging, the GPU's sampler, the worker's message encoded), its steps
counted by callgrind, instructions a decoded row. Load-free: on a shared machine the
clock moves 1.5-2x between minutes, the count by well under 1% between runs (the
interpreter's hash seed fixed). It counts what a row costs in C as well as in Python (the
message's packing, numpy, torch's dispatch, the collector), which bytecode counts miss;
it does not see cache misses or the machine's speed: confirm a cut by time as well
(bench_host_step.py, runs alternated).

    .venv/bin/python benchmarks/bench_host_instructions.py [--rows 256] [--steps 16]
        [--mix greedy|chat|chat-narrow|chat-narrow-json] [--width 64] [--prompt-len 20]
        [--within MODULE:ATTR]

`--width`: the stand-in logits' width for greedy and the narrow mixes (bench_host_step.py's;
chat-narrow-json needs 273 or more).

`--within` counts only inside one function and what it calls (e.g.
`scheduler_worker.sampling:Sampler.sample`, `scheduler_worker.engine:resolve_and_advance`:
the name as the caller looks it up), collection toggled on its entry and exit by
callgrind's client request from a small C helper built here (needs gcc and valgrind's
headers); a toggle costs ~3,000 instructions.

Needs valgrind (Debian: `apt-get install valgrind`). Runs itself under callgrind with
instrumentation off (start-up at ~5x, not ~50x), turns it on for the measured steps
alone (callgrind_control), and reads the main thread's count (a background thread of
the grammar library's is left out). ~4 minutes at 256 rows on the CI's machine.
"""

from __future__ import annotations

import argparse
import glob
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


TOGGLE_C = "#include <valgrind/callgrind.h>\nvoid toggle(void) { CALLGRIND_TOGGLE_COLLECT; }\n"


def count_within(target: str, helper: str) -> None:
    """Wraps `target` (MODULE:ATTR or MODULE:CLASS.ATTR) so that callgrind collects only
    inside it (valgrind run with --collect-atstart=no)."""
    import ctypes
    import functools
    import importlib

    toggle = ctypes.CDLL(helper).toggle
    module, _, attr = target.partition(":")
    owner: object = importlib.import_module(module)
    *path, name = attr.split(".")
    for part in path:
        owner = getattr(owner, part)
    inner = getattr(owner, name)

    @functools.wraps(inner)
    def counted(*args, **kwargs):
        toggle()
        try:
            return inner(*args, **kwargs)
        finally:
            toggle()

    setattr(owner, name, counted)


def measure(
    rows: int, steps: int, mix: str, prompt_len: int, within: str | None, width: int = 64
) -> int:
    """In the process under callgrind: the engine started, `steps` steps counted (inside
    `within` alone, where given); returns the rows they decoded."""
    sys.path.insert(0, str(ROOT))
    if within:
        count_within(within, os.environ["ZS_CALLGRIND_TOGGLE"])
    import torch

    from benchmarks import bench_host_step as host
    from common import collector
    from common.model_files.model_source import resolve_model
    from tests.conftest import copy_tokenizer_files, make_tiny_model

    torch.set_num_threads(1)
    host.PROMPT_LEN, host.VOCAB = prompt_len, width
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = make_tiny_model("llama", Path(tmp) / "tiny-llama")
        copy_tokenizer_files(resolve_model("smollm2"), model_dir)
        host.fit_positions(model_dir, prompt_len + host.OUT_ROOM)
        engine = host.engine_for(model_dir, rows, "auto", mix)
        collector.settle()  # as a served worker once ready
        publish = host.publisher(engine)
        host.start_requests(engine, publish, rows, mix, host.PROMPT_LEN)
        for _ in range(3):
            publish(engine.step_rows())
        control = ["callgrind_control", "-i"]
        subprocess.run([*control, "on", str(os.getpid())], check=True, capture_output=True)
        decoded = 0
        for _ in range(steps):
            publish(engine.step_rows())
            decoded += engine.last_step.num_decode
        subprocess.run([*control, "off", str(os.getpid())], check=True, capture_output=True)
    return decoded


def main_thread_instructions(out_prefix: str) -> int:
    """The instructions of the process's first thread (callgrind --separate-threads)."""
    [first] = glob.glob(out_prefix + ".*-01")
    for line in Path(first).read_text().splitlines():
        if line.startswith("totals:"):
            return int(line.split()[1])
    raise RuntimeError(f"no totals in {first}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=256)
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument(
        "--mix", choices=("greedy", "chat", "chat-narrow", "chat-narrow-json"), default="greedy"
    )
    ap.add_argument("--width", type=int, default=64, help="stand-in logits' width (default 64)")
    ap.add_argument("--prompt-len", type=int, default=20, help="tokens a prompt (default 20)")
    ap.add_argument("--within", help="count inside this function only (MODULE:ATTR)")
    ap.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if not 2 <= a.width <= 1000 or a.mix == "chat-narrow-json" and a.width < 273:
        ap.error("--width must be 2-1000, and 273 or more for chat-narrow-json")
    if a.inside:  # under callgrind
        decoded = measure(a.rows, a.steps, a.mix, a.prompt_len, a.within, a.width)
        print(f"DECODED {decoded}", flush=True)
        return
    with tempfile.TemporaryDirectory() as tmp:
        prefix, env = f"{tmp}/callgrind", {**os.environ, "PYTHONHASHSEED": "0"}
        within = []
        if a.within:
            helper = env["ZS_CALLGRIND_TOGGLE"] = f"{tmp}/toggle.so"
            Path(f"{tmp}/toggle.c").write_text(TOGGLE_C)
            subprocess.run(
                ["cc", "-O2", "-shared", "-fPIC", "-o", helper, f"{tmp}/toggle.c"], check=True
            )
            within = ["--collect-atstart=no", f"--within={a.within}"]
        cmd = [
            "valgrind",
            "--tool=callgrind",
            "--instr-atstart=no",
            *within[:1],
            "--separate-threads=yes",
            f"--callgrind-out-file={prefix}.%p",
            sys.executable,
            __file__,
            "--inside",
            f"--rows={a.rows}",
            f"--steps={a.steps}",
            f"--mix={a.mix}",
            f"--width={a.width}",
            f"--prompt-len={a.prompt_len}",
            *within[1:],
        ]
        run = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=ROOT)
        decoded = [ln for ln in run.stdout.splitlines() if ln.startswith("DECODED ")]
        if run.returncode or not decoded:
            sys.exit(f"the run under callgrind failed (rc {run.returncode}):\n{run.stderr[-3000:]}")
        rows = int(decoded[0].split()[1])
        total = main_thread_instructions(prefix)
    print(
        f"rows {a.rows:4d} ({a.mix}, {a.width} wide, prompts of {a.prompt_len}"
        f"{', within ' + a.within if a.within else ''}): {total / rows:8.0f} instructions a row "
        f"({total:,} over {a.steps} steps, {rows} rows)"
    )


if __name__ == "__main__":
    main()
