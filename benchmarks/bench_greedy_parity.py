"""Greedy text on the integer kernels against the float path that dequantizes the same
GGUF weights (issue 21's target: equal, except where a near-tie explains the difference).

    .venv/bin/python benchmarks/bench_greedy_parity.py --model /tmp/gguf/smollm2-135m-instruct-q4_k_m.gguf

Both engines in-process on the same file: `quantization="gguf"` (the file's blocks on the
C++ kernels, 8-bit activations) and `quantization="none", dtype float32` (every tensor
dequantized once to float32). For each of PROMPTS (chat-templated), `--tokens` greedy
tokens from each; a prompt whose texts differ is explained by the float path's own top-2
log-probability gap at the first differing token, from a fresh prefill of the common
prefix (a near-tie: the 8-bit activations may tip it either way). Prints one line per
prompt and the count; not a timing, so the machine's load does not matter.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import json

import torch

from common.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from common.cpu import cpu_kind_label, cpu_model_name
from common.model_files.model_source import resolve_model
from common.sampling_params import SamplingParams
from scheduler_worker.engine import LLMEngine
from scheduler_worker.model_runner import SeqInput

PROMPTS = [
    "What is the capital of France?",
    "Write two lines about the sea.",
    "List three prime numbers and explain why they are prime.",
    "How do I reverse a list in Python?",
    "Give me a recipe for pancakes.",
    "What causes the seasons on Earth?",
    "Translate 'good morning' into Spanish and German.",
    "Summarize the plot of Romeo and Juliet in two sentences.",
    "What is the difference between a virus and a bacterium?",
    "Name five countries in South America.",
    "Explain what a hash table is.",
    "Why is the sky blue?",
    "Write a haiku about autumn.",
    "What is 17 times 23?",
    "Suggest a name for a small bakery.",
]


def engine(model: str, quantization: str) -> LLMEngine:
    dtype = "float32" if quantization == "none" else "auto"
    return LLMEngine(
        EngineConfig(
            model=ModelConfig(model=model, device="cpu", dtype=dtype, quantization=quantization),
            # no prefix cache: top2_gap writes its own prefill into blocks 1.. of the pool
            cache=CacheConfig(num_blocks=256, enable_prefix_caching=False),
            scheduler=SchedulerConfig(speculative_method="none"),  # the decode step's text
        ),
        resolve_model(model),
    )


def chat_ids(model_dir: Path, text: str) -> list[int]:
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(model_dir)
    ids = tok.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True
    )
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def top2_gap(flt: LLMEngine, ids: list[int]) -> float:
    """The float path's top-2 log-probability gap for the token after `ids`."""
    bs = flt.runner.block_size
    table = list(range(1, (len(ids) + bs - 1) // bs + 1))
    logits = flt.runner.execute([SeqInput(ids, 0, table)])[0]
    top = logits.float().log_softmax(-1).topk(2).values
    return float(top[0] - top[1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2", help="a GGUF file or the default alias")
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--json", help="write the per-prompt results here")
    args = ap.parse_args()
    model_dir = resolve_model(args.model)
    quant, flt = engine(args.model, "gguf"), engine(args.model, "none")
    params = SamplingParams(max_tokens=args.tokens, temperature=0.0, ignore_eos=True)
    print(f"CPU: {cpu_model_name()} ({cpu_kind_label()}); {args.model}, {args.tokens} tokens")
    rows = []
    for text in PROMPTS:
        ids = chat_ids(model_dir, text)
        with torch.inference_mode():
            got = quant.generate([ids], params)[0]
            want = flt.generate([ids], params)[0]
        if got == want:
            rows.append({"prompt": text, "equal": True})
            print(f"  equal      {text}")
            continue
        j = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
        with torch.inference_mode():
            gap = top2_gap(flt, ids + want[:j])
        rows.append({"prompt": text, "equal": False, "at": j, "gap": gap})
        print(f"  differs at token {j:2d}, float top-2 gap {gap:.3f} nats   {text}")
    same = sum(r["equal"] for r in rows)
    gaps = [r["gap"] for r in rows if not r["equal"]]
    print(
        f"equal greedy text: {same} of {len(rows)} prompts; the others part at float top-2 "
        f"gaps {min(gaps, default=0):.3f}-{max(gaps, default=0):.3f} nats"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
