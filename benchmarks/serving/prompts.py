"""The requests' prompts and lengths (--dataset random | fixed | jsonl), with token
counts from a `tokenizers` tokenizer or estimated from words."""

from __future__ import annotations

import argparse
import json
import math
import random
import re
from dataclasses import dataclass
from pathlib import Path

DATA_DIR = Path(__file__).resolve().parents[1] / "data"
DEFAULT_TEXT = DATA_DIR / "pride_and_prejudice_ch1-6.txt"
WORDS_PER_TOKEN = 0.75  # without a tokenizer: the usual "100 tokens ~ 75 English words"


@dataclass
class Spec:
    prompt: str
    prompt_len: int | None  # local count (tokenizer) or estimate (words); None if unknown
    output_len: int


def load_tokenizer(path: str | Path):
    from tokenizers import Tokenizer

    p = Path(path).expanduser()
    if p.is_dir():
        p = p / "tokenizer.json"
    if not p.is_file():
        raise SystemExit(f"--tokenizer: no tokenizer.json at {p}")
    return Tokenizer.from_file(str(p))


def count_tokens(tokenizer, text: str) -> int:
    return len(tokenizer.encode(text, add_special_tokens=False).ids)


def _ranged(rng: random.Random, center: int, ratio: float) -> int:
    lo = max(1, int(center * (1 - ratio)))
    hi = max(lo, int(center * (1 + ratio)))
    return rng.randint(lo, hi)


def random_prompts(
    n: int,
    input_len: int,
    output_len: int,
    range_ratio: float,
    rng: random.Random,
    tokenizer=None,
    text: str | None = None,
) -> list[Spec]:
    """Windows of the text starting at random tokens (or words), about input_len tokens long."""
    base = text if text is not None else DEFAULT_TEXT.read_text(encoding="utf-8")
    in_lens = [_ranged(rng, input_len, range_ratio) for _ in range(n)]
    out_lens = [_ranged(rng, output_len, range_ratio) for _ in range(n)]
    units_needed = max(in_lens) if tokenizer else math.ceil(max(in_lens) * WORDS_PER_TOKEN)

    def spans(t: str) -> list[tuple[int, int]]:
        if tokenizer is None:
            return [m.span() for m in re.finditer(r"\S+", t)]
        return [o for o in tokenizer.encode(t, add_special_tokens=False).offsets if o[1] > o[0]]

    corpus = base
    units = spans(corpus)
    if not units:
        raise ValueError("empty prompt text")
    if len(units) <= units_needed:  # a longer window than the text: repeat it
        corpus = "\n\n".join([base] * (units_needed // len(units) + 2))
        units = spans(corpus)
    specs = []
    for in_len, out_len in zip(in_lens, out_lens):
        k = in_len if tokenizer else max(1, round(in_len * WORDS_PER_TOKEN))
        start = rng.randrange(0, len(units) - k + 1)
        prompt = corpus[units[start][0] : units[start + k - 1][1]]
        plen = count_tokens(tokenizer, prompt) if tokenizer else round(k / WORDS_PER_TOKEN)
        specs.append(Spec(prompt, plen, out_len))
    return specs


def build_specs(args: argparse.Namespace, tokenizer=None) -> list[Spec]:
    rng = random.Random(args.seed)
    n = args.num_prompts
    if args.dataset == "random":
        text = Path(args.dataset_path).read_text(encoding="utf-8") if args.dataset_path else None
        return random_prompts(
            n, args.input_len, args.output_len, args.range_ratio, rng, tokenizer, text
        )
    if args.dataset == "fixed":
        plen = count_tokens(tokenizer, args.prompt) if tokenizer else None
        return [
            Spec(args.prompt, plen, _ranged(rng, args.output_len, args.range_ratio))
            for _ in range(n)
        ]
    if args.dataset == "jsonl":
        rows = []
        with open(args.dataset_path, encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                row = json.loads(line)
                if not isinstance(row, dict) or not isinstance(row.get("prompt"), str):
                    raise SystemExit(
                        f'{args.dataset_path}:{lineno}: expected {{"prompt": str, ...}}'
                    )
                rows.append(row)
        if not rows:
            raise SystemExit(f"{args.dataset_path}: no prompts")
        specs = []
        for i in range(n):
            row = rows[i % len(rows)]
            out_len = row.get("output_len")
            if out_len is None:
                out_len = _ranged(rng, args.output_len, args.range_ratio)
            plen = count_tokens(tokenizer, row["prompt"]) if tokenizer else None
            specs.append(Spec(row["prompt"], plen, int(out_len)))
        return specs
    raise SystemExit(f"unknown dataset {args.dataset!r}")
