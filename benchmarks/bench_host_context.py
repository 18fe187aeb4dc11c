"""How the host's decode step grows with the rows' contexts (issue 52, item 2: the host's
work a step should scale with what changed, not with each row's history).

One engine a prompt length, each as bench_host_step.py runs it (overlapped, greedy, the
forward a graph's staging, the GPU's sampler), all in one process and stepped in turn,
the order flipped every step: a shared machine's slow minutes fall on every length alike,
where separate runs of bench_host_step.py --prompt-len moved 1.5x between minutes. Prints
each length's µs a row (the mean over the steps, block-boundary steps included), the
engine's step and the publish apart, and its ratio to the first length.

    .venv/bin/python benchmarks/bench_host_context.py --rows 256 --prompt-lens 20,2000
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import bench_host_step as host  # noqa: E402
from common import collector  # noqa: E402


def interleaved(model_dir: Path, rows: int, lens: list[int], steps: int) -> dict[int, dict]:
    """Each length's mean seconds a row: {"all", "step", "publish"}, the steps taken in turn."""
    host.PROMPT_LEN = max(lens)  # the KV pool and the graphs' tables fit the longest
    engines = {n: host.engine_for(model_dir, rows) for n in lens}
    before = collector.settle()  # as a served worker once ready (WorkerShell.start)
    publish = {n: host.publisher(e) for n, e in engines.items()}
    for n, e in engines.items():
        host.start_requests(e, publish[n], rows, "greedy", n)
    times: dict[int, dict[str, list[float]]] = {
        n: {"step": [], "publish": [], "rows": []} for n in lens
    }
    for s in range(steps):
        for n in lens if s % 2 == 0 else lens[::-1]:
            e = engines[n]
            t0 = time.perf_counter()
            outs = e.step_rows()  # as the worker's loop
            t1 = time.perf_counter()
            publish[n](outs)
            times[n]["step"].append(t1 - t0)
            times[n]["publish"].append(time.perf_counter() - t1)
            times[n]["rows"].append(e.last_step.num_decode)
    collector.restore(before)
    out = {}
    for n, t in times.items():
        per_row = max(1.0, statistics.mean(t["rows"]))
        step, pub = statistics.mean(t["step"]) / per_row, statistics.mean(t["publish"]) / per_row
        out[n] = {"all": step + pub, "step": step, "publish": pub}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=256)
    ap.add_argument("--prompt-lens", default="20,2000", help="prompt lengths, comma-separated")
    ap.add_argument("--steps", type=int, default=300)
    args = ap.parse_args()
    lens = [int(x) for x in args.prompt_lens.split(",")]
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        from common.model_files.model_source import resolve_model
        from tests.conftest import copy_tokenizer_files, make_tiny_model

        model_dir = make_tiny_model("llama", Path(tmp) / "tiny-llama")
        copy_tokenizer_files(resolve_model("smollm2"), model_dir)
        host.fit_positions(model_dir, max(lens) + host.OUT_ROOM)
        got = interleaved(model_dir, args.rows, lens, args.steps)
    base = got[lens[0]]["all"]
    for n in lens:
        g = got[n]
        print(
            f"rows {args.rows} prompt {n:6d}: {g['all'] * 1e6:6.2f} µs a row "
            f"(step {g['step'] * 1e6:.2f}, publish {g['publish'] * 1e6:.2f}); "
            f"{g['all'] / base:.2f}x prompt {lens[0]}'s"
        )


if __name__ == "__main__":
    main()
