"""Offline engine benchmark: throughput and per-step time vs batch size, against
transformers `generate` on the same prompts in the same run.

    python benchmarks/bench_engine.py --model smollm2 --dtype bfloat16,float32 \
        --num-requests 32 --input-len 128 --min-output 16 --max-output 256 \
        --json bench_results/engine.json

An engine spec is a dtype, optionally with weight-only quantization: `bfloat16+int4`.

Prints a table; writes JSON with every figure.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import time
from pathlib import Path

import torch

from common.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from common.cpu import cpu_flags, cpu_kind_label, cpu_model_name
from common.model_files.model_source import hf_reference_dir, resolve_model
from common.sampling_params import SamplingParams
from scheduler_worker.engine import LLMEngine


def make_workload(n: int, input_len: int, min_out: int, max_out: int, vocab: int, seed: int):
    rng = random.Random(seed)
    prompts = [[rng.randrange(100, vocab) for _ in range(input_len)] for _ in range(n)]
    out_lens = [rng.randint(min_out, max_out) for _ in range(n)]
    return prompts, out_lens


def bench_engine(engine: LLMEngine, prompts, out_lens) -> dict:
    params = [SamplingParams(max_tokens=m, temperature=0.0, ignore_eos=True) for m in out_lens]
    engine.generate([prompts[0]], SamplingParams(max_tokens=4, ignore_eos=True))  # warm up
    busy0 = dict(engine.counters.busy_time)
    t0 = time.perf_counter()
    outs = engine.generate(prompts, params)
    elapsed = time.perf_counter() - t0
    n_out = sum(map(len, outs))
    assert n_out == sum(out_lens), "ignore_eos: every request must produce exactly max_tokens"
    busy = {k: engine.counters.busy_time[k] - busy0[k] for k in busy0}
    return {
        "seconds": elapsed,
        "output_tokens": n_out,
        "tokens_per_s": n_out / elapsed,
        "busy_seconds": busy,
    }


def bench_step_time(engine: LLMEngine, batch: int, ctx: int, steps: int = 16) -> float:
    """Mean decode-step time with `batch` requests decoding at context ~ctx."""
    params = SamplingParams(max_tokens=steps + 4, temperature=0.0, ignore_eos=True)
    rng = random.Random(batch)
    for i in range(batch):
        engine.add_request(
            f"step-{batch}-{i}", [rng.randrange(100, 1000) for _ in range(ctx)], params
        )
    while any(r.num_output_tokens == 0 for r in engine.requests.values()):
        engine.step()
    engine.step()
    t0 = time.perf_counter()
    for _ in range(steps):
        engine.step()
    dt = (time.perf_counter() - t0) / steps
    while engine.has_unfinished():
        engine.step()
    return dt


def bench_hf(model_dir: Path, dtype: torch.dtype, prompts, out_lens, batch: int) -> dict:
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(
        hf_reference_dir(model_dir), dtype=dtype
    ).eval()
    model.generation_config.eos_token_id = None
    useful, t0 = 0, time.perf_counter()
    with torch.inference_mode():
        model.generate(torch.tensor(prompts[:1]), max_new_tokens=4, do_sample=False, pad_token_id=0)
        t0 = time.perf_counter()
        for i in range(0, len(prompts), batch):
            ids = torch.tensor(prompts[i : i + batch])
            n = max(out_lens[i : i + batch])  # a static batch runs until its longest member
            model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=n,
                min_new_tokens=n,
                do_sample=False,
                pad_token_id=0,
            )
            useful += sum(out_lens[i : i + batch])
    elapsed = time.perf_counter() - t0
    return {"seconds": elapsed, "output_tokens": useful, "tokens_per_s": useful / elapsed}


def hf_token_latency(model_dir: Path, dtype: torch.dtype, prompt, n: int = 64) -> float:
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(
        hf_reference_dir(model_dir), dtype=dtype
    ).eval()
    model.generation_config.eos_token_id = None
    ids = torch.tensor([prompt])
    with torch.inference_mode():
        model.generate(ids, max_new_tokens=4, do_sample=False, pad_token_id=0)
        t0 = time.perf_counter()
        model.generate(ids, max_new_tokens=1, do_sample=False, pad_token_id=0)
        prefill = time.perf_counter() - t0
        t0 = time.perf_counter()
        model.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0)
        total = time.perf_counter() - t0
    return (total - prefill) / (n - 1)


def engine_token_latency(engine: LLMEngine, prompt, n: int = 64) -> float:
    return bench_step_time(engine, 1, len(prompt), steps=n)


def machine_info() -> dict:
    flags = cpu_flags()
    return {
        "cpu": cpu_model_name()
        if cpu_model_name() != "unknown CPU"
        else (platform.processor() or platform.machine()),
        "cpu_kind": cpu_kind_label(),  # "avx2 (emulated on avx512)" under ZEROSERVE_CPU_KIND
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "cpu_flags": [
            f
            for f in ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16", "amx_tile")
            if f in flags
        ],
    }


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--model", default="smollm2")
    ap.add_argument(
        "--dtype",
        default="bfloat16,float32",
        help="engine dtypes, comma-separated; DTYPE+int8|int4 adds weight-only quantization",
    )
    ap.add_argument("--num-requests", type=int, default=32)
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--min-output", type=int, default=16)
    ap.add_argument("--max-output", type=int, default=256)
    ap.add_argument("--max-num-seqs", type=int, default=32)
    ap.add_argument("--max-num-batched-tokens", type=int, default=512)
    ap.add_argument("--step-batch-sizes", default="1,4,16,32,64")
    ap.add_argument("--hf-dtypes", default="bfloat16,float32", help="'' to skip the baseline")
    ap.add_argument("--hf-batch", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()

    model_dir = resolve_model(args.model)
    res: dict = {
        "machine": machine_info(),
        "args": {k: str(v) for k, v in vars(args).items()},
        "engines": {},
        "hf": {},
    }
    prompts = out_lens = None
    for dtype_name in args.dtype.split(","):
        dtype, _, quant = dtype_name.partition("+")
        cfg = EngineConfig(
            model=ModelConfig(model=args.model, dtype=dtype, quantization=quant or "none"),
            cache=CacheConfig(kv_cache_memory_gb=2.0),
            scheduler=SchedulerConfig(
                max_num_seqs=max(args.max_num_seqs, 64),
                max_num_batched_tokens=args.max_num_batched_tokens,
                max_decode_batch=args.max_num_seqs,
                speculative_method="none",  # the plain step, as transformers' generate
            ),
        )
        engine = LLMEngine(cfg, model_dir)
        if prompts is None:
            prompts, out_lens = make_workload(
                args.num_requests,
                args.input_len,
                args.min_output,
                args.max_output,
                engine.vocab_size,
                args.seed,
            )
        r = {
            "dtype": str(engine.runner.dtype).replace("torch.", ""),
            "quantization": quant or "none",
        }
        r["throughput"] = bench_engine(engine, prompts, out_lens)
        r["step_time_s"] = {
            b: bench_step_time(engine, b, args.input_len)
            for b in map(int, args.step_batch_sizes.split(","))
        }
        r["token_latency_s"] = engine_token_latency(engine, prompts[0])
        res["engines"][dtype_name] = r
        del engine
    for name in filter(None, args.hf_dtypes.split(",")):
        dtype = getattr(torch, name)
        res["hf"][name] = bench_hf(model_dir, dtype, prompts, out_lens, args.hf_batch)
        res["hf"][name]["token_latency_s"] = hf_token_latency(model_dir, dtype, prompts[0])

    print(
        f"\n{args.num_requests} requests, input {args.input_len} tokens, output uniform "
        f"{args.min_output}-{args.max_output} (ignore_eos), {res['machine']['threads']} threads"
    )
    for name, r in res["engines"].items():
        e = r["throughput"]
        print(
            f"\nengine --dtype {name} ({r['dtype']}): {e['tokens_per_s']:.1f} output tok/s "
            f"({e['output_tokens']} tokens in {e['seconds']:.1f}s); batch-1 per token "
            f"{r['token_latency_s'] * 1e3:.1f} ms"
        )
        busy = e["busy_seconds"]
        total = sum(busy.values()) or 1.0
        print("  busy split: " + ", ".join(f"{k} {v / total:.0%}" for k, v in busy.items()))
        print("  batch | decode step ms | tok/s")
        for b, dt in r["step_time_s"].items():
            print(f"  {b:5d} | {dt * 1e3:14.2f} | {b / dt:7.1f}")
    if res["hf"]:
        print(f"\ntransformers generate, static batches of {args.hf_batch}:")
        for name, h in res["hf"].items():
            ratios = ", ".join(
                f"engine {k}/hf = {r['throughput']['tokens_per_s'] / h['tokens_per_s']:.2f}x"
                for k, r in res["engines"].items()
            )
            print(
                f"  {name:9s}: {h['tokens_per_s']:7.1f} tok/s  ({ratios}); batch-1 per token "
                f"{h['token_latency_s'] * 1e3:.1f} ms"
            )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(res, indent=2))
        print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
