"""Weight-only quantization microbenchmark: the time of every linear layer of a model for
one step of M rows (tokens), dense vs the packed int8/int4 kernels of scheduler_worker/quant.py.

    python benchmarks/bench_quant.py --model smollm2 --dtype bfloat16 --rows 1,2,4,8,16,32

Times each distinct layer shape once per method and row count and multiplies by how many
layers have that shape, so the figure is "ms per step spent in linears". As in
quant.quantize_model, "int4" keeps lm_head at int8. Prints a table;
--json writes it. This is where --quantization's row threshold (quant.DEFAULT_MAX_ROWS)
comes from: the packed kernels win while a step is weight-bound and lose once the dense
GEMM's compute catches up.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path

import torch
from torch import nn

REPO = Path(__file__).resolve().parents[1]
if __package__ in (None, ""):
    sys.path.insert(0, str(REPO))

from benchmarks.bench_engine import machine_info  # noqa: E402
from common.model_source import resolve_model  # noqa: E402
from scheduler_worker.models import load_model  # noqa: E402
from scheduler_worker.quant import WeightOnlyLinear  # noqa: E402


def time_ms(fn, reps: int) -> float:
    for _ in range(3):
        fn()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t0) / reps * 1e3


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    ap.add_argument("--rows", default="1,2,4,8,16,32")
    ap.add_argument("--methods", default="int8,int4")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    dtype = getattr(torch, args.dtype)
    methods = [m for m in args.methods.split(",") if m]
    model, margs = load_model(resolve_model(args.model), torch.float32, torch.device("cpu"))
    shapes: Counter = Counter()
    layers: dict[tuple[int, int], nn.Linear] = {}
    heads = set()  # quantize_model keeps lm_head at int8 under int4: time it the same way
    for name, mod in model.named_modules():
        if isinstance(mod, nn.Linear):
            key = (mod.out_features, mod.in_features)
            shapes[key] += 1
            layers.setdefault(key, mod)
            if name.rpartition(".")[2] == "lm_head":
                heads.add(key)
    variants: dict[str, dict[tuple[int, int], nn.Module]] = {"dense": {}}
    for key, lin in layers.items():
        variants["dense"][key] = nn.Linear(key[1], key[0], bias=lin.bias is not None).to(dtype)
        variants["dense"][key].load_state_dict({k: v.to(dtype) for k, v in lin.state_dict().items()})
        for m in methods:  # packed path for every row count (max_rows = huge)
            eff = "int8" if m == "int4" and key in heads else m
            variants.setdefault(m, {})[key] = WeightOnlyLinear(lin, eff, dtype, max_rows=1 << 30)
    rows = [int(r) for r in args.rows.split(",")]
    res: dict = {"machine": machine_info(), "model": args.model, "architecture": margs.architecture,
                 "dtype": args.dtype, "shapes": {f"{n}x{k}": c for (n, k), c in shapes.items()},
                 "ms_per_step": {}}  # fmt: skip
    with torch.inference_mode():
        for m_rows in rows:
            out = {}
            for name, mods in variants.items():
                total = 0.0
                for key, mod in mods.items():
                    x = torch.randn(m_rows, key[1]).to(dtype)
                    total += time_ms(lambda mod=mod, x=x: mod(x), args.reps) * shapes[key]
                out[name] = total
            res["ms_per_step"][m_rows] = out
    names = list(variants)
    print(f"{args.model} ({margs.architecture}), {sum(shapes.values())} linears, {args.dtype}, "
          f"{res['machine']['cpu']}, {res['machine']['threads']} threads: ms per step in linears")
    print("rows | " + " | ".join(f"{n:>8}" for n in names))
    for m_rows, out in res["ms_per_step"].items():
        print(f"{m_rows:4d} | " + " | ".join(f"{out[n]:8.2f}" for n in names))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(res, indent=1))
        print(f"wrote {args.json}")
    return res


if __name__ == "__main__":
    main()
