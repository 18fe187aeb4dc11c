"""Quantized-linear microbenchmark: the time of every linear layer of a model for one
step of M rows (tokens), dense float32 / bfloat16 GEMMs vs the block-quantized C++ kernels
(scheduler_worker/kernels) on each ISA path this CPU has.

    python benchmarks/bench_quant.py --model smollm2 --rows 1,8,32,64,512

Times each distinct layer shape once per variant and row count and multiplies by how many
layers have that shape, so the figure is "ms per step spent in linears". The kernel rows
use int4 blocks (Q4_1's recipe) with lm_head at int8 (Q8_0's), the default GGUF's layout,
with float32 activations ("q4/ISA") and bfloat16 ones ("q4/ISA/bf16"). Prints a table;
--json writes it. This is where the engine's choice of kernel per step size comes from.

--gguf-types Q5_0,Q4_K,... adds rows "TYPE/ISA" (float32 activations) for GGUF block
formats, every linear in that type made of random valid blocks (the values do not change
the time); a K-quant on a row length that is not a multiple of 256 falls back as
llama-quantize does (Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0).

--per-byte Q6_K,Q4_K times one qlinear per type, shape (--shapes NxK,...) and row count
instead, as ns per byte of the file's weight (the kernels' efficiency per format; no model
is loaded):

    python benchmarks/bench_quant.py --per-byte Q6_K,Q4_K,Q8_0 --shapes 49152x512,576x1536 --rows 1,32

With --isas rows,scalar,... it times the row-by-row path of a type without a kernel
(gguf-py dequantizes the rows each call) beside the portable kernel and the tiles.

Large outputs come from the heap, as in the engine (scheduler_worker/heap.py).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path

import gguf
import numpy as np
import torch
from torch import nn

REPO = Path(__file__).resolve().parents[1]
if __package__ in (None, ""):
    sys.path.insert(0, str(REPO))

from benchmarks.bench_engine import machine_info  # noqa: E402
from common.model_files.model_source import resolve_model  # noqa: E402
from scheduler_worker import kernels  # noqa: E402
from scheduler_worker.heap import keep_step_buffers_in_heap  # noqa: E402
from scheduler_worker.models import load_model  # noqa: E402
from scheduler_worker.quant.dequant_linear import DequantLinear  # noqa: E402
from scheduler_worker.quant.formats import (  # noqa: E402
    FORMATS,
    GGUF_BLOCK_TYPES,
    BlockWeight,
    from_gguf,
)
from scheduler_worker.quant.linear import QuantLinear, quantize_weight  # noqa: E402

K_FALLBACK = {"Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0"}  # llama-quantize's, rows not % 256


def random_gguf_weight(type_name: str, n: int, k: int, seed: int = 0) -> BlockWeight:
    """An [n, k] weight of random valid `type_name` blocks (small float16 scales)."""
    if type_name in K_FALLBACK and k % 256:
        type_name = K_FALLBACK[type_name]
    return from_gguf(random_gguf_rows(type_name, n, k, seed), type_name, n, k)


class RowByRow(DequantLinear):
    """The path of a GGUF type with no row in the formats table: the file's rows
    dequantized by gguf-py on every call (`--isas rows`: a format's speed before its row)."""

    def rows(self, start: int, end: int) -> torch.Tensor:
        qtype = gguf.GGMLQuantizationType[self.source]
        out = gguf.quants.dequantize(self.raw[start:end].numpy(), qtype)
        return torch.from_numpy(out.reshape(end - start, self.in_features))


def random_gguf_rows(type_name: str, n: int, k: int, seed: int = 0) -> np.ndarray:
    """The file's bytes [n, row bytes] of random valid `type_name` blocks."""
    rng = np.random.default_rng(seed)
    form, size = GGUF_BLOCK_TYPES[type_name]
    units = k // FORMATS[form].unit
    blocks = rng.integers(0, 256, (n, units, size), dtype=np.uint8)
    nf = 1 if type_name in ("Q4_0", "Q5_0", "Q8_0", "Q6_K", "IQ4_XS") else 2
    f = rng.uniform(1e-3, 1e-2, (n, units, nf)).astype(np.float16)
    at = size - 2 if type_name == "Q6_K" else 0  # Q6_K keeps its d last
    blocks[..., at : at + 2 * nf] = f.view(np.uint8).reshape(n, units, 2 * nf)
    return blocks.reshape(n, -1)


def time_ms(fn, reps: int, min_of: int = 0) -> float:
    """Mean of `reps` calls; with min_of, the fastest of that many single calls instead
    (a call preempted by another process on a shared machine then drops out)."""
    for _ in range(3):
        fn()
    if min_of:
        best = float("inf")
        for _ in range(min_of):
            t0 = time.perf_counter()
            fn()
            best = min(best, time.perf_counter() - t0)
        return best * 1e3
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t0) / reps * 1e3


def per_byte(
    types: list[str], shapes: list[tuple[int, int]], rows: list[int], isas: list[str], min_of: int
):
    """ns per byte of the file's weight for one qlinear call of each type, shape, row count
    and kernel path: {"TYPE NxK M=rows ISA": ns}. Prints them."""
    res = {}
    for n, k in shapes:
        for type_name in types:
            bw = random_gguf_weight(type_name, n, k)
            if bw.source != type_name:
                sys.exit(f"{type_name} needs rows of whole super-blocks (K % 256), got {k}")
            form, size = GGUF_BLOCK_TYPES[type_name]
            unit = FORMATS[form].unit
            file_bytes = n * k // unit * size
            for isa in isas:
                ql: nn.Module = (
                    RowByRow(random_gguf_rows(type_name, n, k), type_name, n, k)
                    if isa == "rows"
                    else QuantLinear(bw, None, torch.float32, isa)
                )
                for m_rows in rows:
                    x = torch.randn(m_rows, k)
                    reps = max(5, int(3e8 / (file_bytes * max(1, m_rows // 4))))
                    with torch.inference_mode():
                        ms = time_ms(lambda ql=ql, x=x: ql(x), reps, min_of)
                    key = f"{type_name} {n}x{k} M={m_rows} {isa}"
                    res[key] = ms * 1e6 / file_bytes
                    print(f"{key:32s} {res[key]:7.3f} ns/byte  ({ms:.3f} ms)", flush=True)
    return res


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--rows", default="1,8,32,64,512")
    ap.add_argument(
        "--isas",
        default=",".join(kernels.ISAS[1:]),
        help="kernel paths to time (those this CPU lacks are skipped); --per-byte also takes"
        " `rows`: the file's rows dequantized per call, as a type with no kernel is served",
    )
    ap.add_argument(
        "--gguf-types", default="", help="GGUF block types to time too, e.g. Q5_0,Q4_K,Q5_K"
    )
    ap.add_argument("--per-byte", default="", help="GGUF types to time per weight byte")
    ap.add_argument("--shapes", default="49152x512,576x1536", help="NxK shapes for --per-byte")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--min-of", type=int, default=0, help="--per-byte: fastest of N single calls")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    # outputs from the heap, as the engine has them: else each call's output above glibc's
    # mmap threshold (Gemma 3's head: 33.5 MB at 32 rows) is a fresh map, zero-filled page
    # by page, and a wide weight times that (25 ms against 15 at 32 rows)
    keep_step_buffers_in_heap()
    if not kernels.load():
        sys.exit("the CPU kernels are not built: python -m scheduler_worker.kernels --require")
    best = kernels.ISAS.index(kernels.best_isa())
    isas = [i for i in args.isas.split(",") if i == "rows" or i and kernels.isa_index(i) <= best]
    rows = [int(r) for r in args.rows.split(",")]
    if args.per_byte:
        shapes = [(int(a), int(b)) for a, b in (s.split("x") for s in args.shapes.split(","))]
        ns = per_byte(args.per_byte.split(","), shapes, rows, isas, args.min_of)
        return {"machine": machine_info(), "ns_per_byte": ns}
    model, margs = load_model(
        resolve_model(args.model, full_weights=True), torch.float32, torch.device("cpu")
    )
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
    variants: dict[str, tuple[torch.dtype, dict[tuple[int, int], nn.Module]]] = {}
    for key, lin in layers.items():
        for dtype in (torch.float32, torch.bfloat16):
            dense = nn.Linear(key[1], key[0], bias=lin.bias is not None).to(dtype)
            dense.load_state_dict({k: v.to(dtype) for k, v in lin.state_dict().items()})
            variants.setdefault(f"dense/{str(dtype)[6:]}", (dtype, {}))[1][key] = dense
        bw = quantize_weight(lin.weight, "int8" if key in heads else "int4")
        for isa in isas:
            for dtype, tag in ((torch.float32, ""), (torch.bfloat16, "/bf16")):
                ql = QuantLinear(bw, lin.bias, dtype, isa)
                variants.setdefault(f"q4/{isa}{tag}", (dtype, {}))[1][key] = ql
        for type_name in filter(None, args.gguf_types.split(",")):
            gw = random_gguf_weight(type_name, *key)
            for isa in isas:
                ql = QuantLinear(gw, lin.bias, torch.float32, isa)
                variants.setdefault(f"{type_name}/{isa}", (torch.float32, {}))[1][key] = ql
    res: dict = {
        "machine": machine_info(),
        "model": args.model,
        "architecture": margs.architecture,
        "shapes": {f"{n}x{k}": c for (n, k), c in shapes.items()},
        "ms_per_step": {},
    }
    with torch.inference_mode():
        for m_rows in rows:
            out = {}
            for name, (dtype, mods) in variants.items():
                total = 0.0
                for key, mod in mods.items():
                    x = torch.randn(m_rows, key[1]).to(dtype)
                    total += time_ms(lambda mod=mod, x=x: mod(x), args.reps) * shapes[key]
                out[name] = total
            res["ms_per_step"][m_rows] = out
    names = list(variants)
    print(
        f"{args.model} ({margs.architecture}), {sum(shapes.values())} linears, "
        f"{res['machine']['cpu']}, {res['machine']['threads']} threads: ms per step in linears"
    )
    width = max(len(n) for n in names)
    print("rows | " + " | ".join(f"{n:>{width}}" for n in names))
    for m_rows, out in res["ms_per_step"].items():
        print(f"{m_rows:4d} | " + " | ".join(f"{out[n]:{width}.2f}" for n in names))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(res, indent=1))
        print(f"wrote {args.json}")
    return res


if __name__ == "__main__":
    main()
