"""torch.compile against eager for the pure-torch float decode step (issue 16, item 2).

    .venv/bin/python benchmarks/bench_compile.py

The default model with `--kernels torch --quantization none --dtype float32` (the path
torch.compile could fuse: the default path is one C++ call per step), one decode step
(model forward + lm_head) at batch 1 and 8, 140-ish tokens of context; eager and
`torch.compile(model, dynamic=False)` alternate, best of 3 x 20 steps each.
"""

import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import sys
import time

import torch

from common.config import CacheConfig, EngineConfig, ModelConfig
from common.model_files.model_source import resolve_model
from scheduler_worker.model_runner import ModelRunner, SeqInput

d = resolve_model("smollm2")
r = ModelRunner(
    EngineConfig(
        model=ModelConfig(model="smollm2", kernels="torch", quantization="none", dtype="float32"),
        cache=CacheConfig(block_size=16, num_blocks=2048),
    ),
    d,
)
eager = r.model
compiled = torch.compile(eager, dynamic=False)


def run(model, seqs, n):
    ids, pos, meta = r.prepare(seqs)
    with torch.inference_mode():
        t0 = time.perf_counter()
        for _ in range(n):
            h = model(ids, pos, r.kv_caches, meta)
            r.model.compute_logits(h[meta.logits_indices])
        return (time.perf_counter() - t0) / n * 1e3


for bsz in (1, 8):
    seqs = [SeqInput([5], 140 + 3 * i, list(range(i * 12, i * 12 + 12))) for i in range(bsz)]
    t0 = time.perf_counter()
    run(compiled, seqs, 3)
    print(f"batch {bsz}: compile+3 steps {time.perf_counter() - t0:.1f} s", flush=True)
    res = {"eager": [], "compiled": []}
    for _ in range(3):
        res["eager"].append(run(eager, seqs, 20))
        res["compiled"].append(run(compiled, seqs, 20))
    print(bsz, {k: f"{min(v):.2f} ms" for k, v in res.items()}, flush=True)
