"""Speculative decoding under load: output tok/s of N concurrent streams with ngram drafts
(or a draft model's: --draft-model) (the adaptive switch, spec/policy.py, or every draft)
against none, in one engine (the request's `speculative` flag switches it), alternating
A/B rounds, greedy; the outputs must be equal token for token.

    python benchmarks/bench_spec_load.py --streams 1,8,32 --workload repeat,chat
    python benchmarks/bench_spec_load.py --streams 1,8 --draft-model smollm2 \
        --dtype float16 --quantization none   # the Q4_1 file drafting for float16 weights

Each stream has its own prompt: `repeat` asks to repeat a paragraph of the shipped Pride
and Prejudice text (prompt lookup pays), `chat` asks for a story on its own subject (little
to look up). Prints one line a run and, per streams x workload, the ratio of the medians.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from common.config import EngineConfig, ModelConfig, SchedulerConfig
from common.cpu import cpu_model_name
from common.sampling_params import SamplingParams
from scheduler_worker.engine import LLMEngine

TEXT = Path(__file__).parent / "data" / "pride_and_prejudice_ch1-6.txt"
SUBJECTS = [
    "a dragon who learns to cook", "a lighthouse keeper", "a lost robot", "a clockmaker",
    "a city under the sea", "a talking cat", "a winter festival", "a desert caravan",
]  # fmt: skip


def prompts(model_dir, workload: str, n: int) -> list[list[int]]:
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(model_dir)
    paragraphs = [p for p in TEXT.read_text().split("\n\n") if 300 < len(p) < 900]
    out = []
    for i in range(n):
        if workload == "repeat":
            ask = (
                f"Repeat the following passage word for word.\n\n{paragraphs[i % len(paragraphs)]}"
            )
        else:
            ask = f"Write a short story about {SUBJECTS[i % len(SUBJECTS)]} (take {i})."
        ids = tok.apply_chat_template(
            [{"role": "user", "content": ask}], add_generation_prompt=True, tokenize=True
        )
        out.append(list(ids["input_ids"] if hasattr(ids, "keys") else ids))
    return out


def run(engine: LLMEngine, batch: list[list[int]], max_tokens: int, spec: bool):
    """The outputs, output tokens per wall second and per CPU second of this process."""
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, speculative=spec)
    t0, c0 = time.perf_counter(), time.process_time()
    outs = engine.generate(batch, params)
    n = sum(map(len, outs))
    return outs, n / (time.perf_counter() - t0), n / (time.process_time() - c0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--streams", default="1,8,32")
    ap.add_argument("--workload", default="repeat,chat")
    ap.add_argument("--policy", choices=("adaptive", "always"), default="adaptive")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--num-speculative-tokens", type=int, default=4)
    ap.add_argument("--draft-model", default=None, help="drafts from this model, not ngram")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--quantization", default="auto")
    ap.add_argument("--threads", type=int, default=None)
    a = ap.parse_args()
    method = "ngram" if a.draft_model is None else "draft"
    engine = LLMEngine(
        EngineConfig(
            model=ModelConfig(
                model=a.model, dtype=a.dtype, quantization=a.quantization, num_threads=a.threads
            ),
            scheduler=SchedulerConfig(
                speculative_method=method,
                speculative_model=a.draft_model,
                num_speculative_tokens=a.num_speculative_tokens,
                speculative_policy=a.policy,
            ),
        )
    )
    print(f"cpu: {cpu_model_name()}; {method}; policy {a.policy}; k {a.num_speculative_tokens}")
    summary = []
    for workload in a.workload.split(","):
        for n in map(int, a.streams.split(",")):
            batch = prompts(engine.model_dir, workload, n)
            run(engine, batch, 8, True)  # warm up (and the policy's first fit)
            rates: dict[bool, list[float]] = {False: [], True: []}
            outs: dict[bool, list] = {}
            for r in range(a.rounds):
                for spec in (False, True) if r % 2 == 0 else (True, False):
                    d0, a0 = engine.counters.draft_tokens, engine.counters.accepted_tokens
                    out, wall, cpu = run(engine, batch, a.max_tokens, spec)
                    rates[spec].append(cpu)
                    outs.setdefault(spec, out)
                    print(
                        f"{workload} x{n} round {r} {method if spec else 'none '}: "
                        f"{wall:.1f} tok/s, {cpu:.1f} tok per CPU s, drafted "
                        f"{engine.counters.draft_tokens - d0}, accepted "
                        f"{engine.counters.accepted_tokens - a0}",
                        flush=True,
                    )
            same = outs[True] == outs[False]
            ratio = statistics.median(rates[True]) / statistics.median(rates[False])
            summary.append(f"{workload} x{n}: {ratio:.2f}x (tok per CPU s), equal {same}")
            if not same:  # a float GEMM may round rows by the call's row count (benchmarks.md)
                print(f"{workload} x{n}: {method} output differs from plain greedy", flush=True)
    print(f"switched-off steps: {engine.scheduler.policy.num_switched_off}")
    print("\n".join(summary))


if __name__ == "__main__":
    main()
