"""The workload of a comparison: one prompt set for every row."""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path
from typing import Any

from benchmarks import bench_serving


class Workload:
    """The prompts every row sees, as text and as the token ids the server's tokenizer
    makes of them (`add_special_tokens=True`, like tokenizer_worker)."""

    def __init__(self, args: argparse.Namespace, model_dir: Path) -> None:
        tok = bench_serving.load_tokenizer(model_dir)
        n, k = args.num_requests, args.single_requests
        rng = random.Random(args.seed)
        specs = bench_serving.random_prompts(
            1 + n + k, args.input_len, args.output_len, 0.0, rng, tok
        )
        texts = [s.prompt for s in specs]
        ids = [tok.encode(t, add_special_tokens=True).ids for t in texts]
        self.warmup_text, self.warmup_ids = texts[0], ids[0]
        self.main_texts, self.main_ids = texts[1 : 1 + n], ids[1 : 1 + n]
        self.single_texts, self.single_ids = texts[1 + n :], ids[1 + n :]
        self.output_len = args.output_len
        self.single_output_len = args.single_output_len

    def describe(self) -> dict[str, Any]:
        lens = [len(x) for x in self.main_ids]
        single = [len(x) for x in self.single_ids]
        return {
            "num_requests": len(self.main_ids),
            "output_len": self.output_len,
            "input_tokens_min": min(lens),
            "input_tokens_max": max(lens),
            "input_tokens_mean": sum(lens) / len(lens),
            "single_requests": len(self.single_ids),
            "single_input_tokens_mean": sum(single) / len(single) if single else None,
            "single_output_len": self.single_output_len,
        }

    def write_jsonl(self, path: Path, texts: list[str], output_len: int) -> Path:
        with open(path, "w", encoding="utf-8") as f:
            for t in texts:
                f.write(json.dumps({"prompt": t, "output_len": output_len}) + "\n")
        return path
