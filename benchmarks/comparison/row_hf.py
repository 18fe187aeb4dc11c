"""Row (d): transformers `generate` as a user writes it, static batches."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from benchmarks.comparison.util import median
from benchmarks.comparison.workload import Workload


def hf_dtype(args: argparse.Namespace):
    from scheduler_worker.model_runner import TORCH_DTYPES, resolve_device, resolve_dtype

    device = resolve_device(args.device)
    if args.hf_dtype == "auto":
        return resolve_dtype("auto", device), device
    return TORCH_DTYPES[args.hf_dtype], device


def row_hf(args: argparse.Namespace, w: Workload, model_dir: Path) -> dict[str, Any]:
    import torch
    import transformers

    from common.model_files.model_source import hf_reference_dir

    dtype, device = hf_dtype(args)
    batch = args.hf_batch or args.concurrency
    n = w.output_len
    tok = transformers.AutoTokenizer.from_pretrained(model_dir, padding_side="left")
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    model = transformers.AutoModelForCausalLM.from_pretrained(
        hf_reference_dir(model_dir), dtype=dtype
    )
    model = model.to(device).eval()

    def generate(texts: list[str], new: int) -> int:
        enc = tok(texts, return_tensors="pt", padding=True).to(device)
        out = model.generate(
            **enc,
            max_new_tokens=new,
            min_new_tokens=new,
            do_sample=False,
            pad_token_id=tok.pad_token_id,
        )
        got = out.shape[1] - enc["input_ids"].shape[1]
        if got != new:
            raise RuntimeError(f"generate made {got} tokens, asked for {new}")
        return got * len(texts)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()

    with torch.inference_mode():
        generate([w.warmup_text], 16)
        sync()
        t0 = time.perf_counter()
        n_out = 0
        for i in range(0, len(w.main_texts), batch):
            n_out += generate(w.main_texts[i : i + batch], n)
        sync()
        elapsed = time.perf_counter() - t0
        ttft = []
        for text in w.single_texts:
            t1 = time.perf_counter()
            generate([text], 1)
            sync()
            ttft.append((time.perf_counter() - t1) * 1e3)
    return {
        "dtype": str(dtype).replace("torch.", ""),
        "device": str(device),
        "batch": batch,
        "transformers": transformers.__version__,
        "main": {"seconds": elapsed, "output_tokens": n_out, "output_throughput": n_out / elapsed},
        "single_ttft_ms": ttft,
        "output_tok_s": n_out / elapsed,
        "ttft_p50_ms": median(ttft),
        "tpot_median_ms": None,
        "forward_share": None,
        "warnings": [],
    }
