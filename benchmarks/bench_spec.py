"""Speculative decoding at one stream: output tok/s with and without ngram drafts in one
engine (the request's `speculative` flag switches it), alternating A/B runs, greedy (or
`--sampled`: temperature 0.7, top_p 0.9, a seed); the outputs must be equal token for token.

    python benchmarks/bench_spec.py --model smollm2 --rounds 4 --max-tokens 128 [--sampled]

The `repeat` prompt asks the model to repeat a passage (prompt lookup pays there), `chat`
asks for a story (little to look up). Prints one line a run and the ratio of the medians.
"""

from __future__ import annotations

import argparse
import statistics
import time

from common.config import EngineConfig, ModelConfig, SchedulerConfig
from common.cpu import cpu_model_name
from common.sampling_params import SamplingParams
from scheduler_worker.engine import LLMEngine

PASSAGE = (
    "The committee met on Tuesday to review the budget for the coming year. After a long "
    "discussion, the members agreed to increase the funding for the public library by ten "
    "percent, to repair the bridge over the river before the winter, and to hire two more "
    "teachers for the primary school. The mayor thanked everyone for their work and said "
    "that the town would publish the full report on its website next week."
)


ASKS = {
    "repeat": f"Repeat the following passage word for word.\n\n{PASSAGE}",
    # little to look up: what the drafts cost when they are refused
    "chat": "Write a short story about a dragon who learns to cook.",
}


def chat_prompt(model_dir, workload: str = "repeat") -> list[int]:
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(model_dir)
    messages = [{"role": "user", "content": ASKS[workload]}]
    ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def run(
    engine: LLMEngine, prompt: list[int], max_tokens: int, spec: bool, sampled: bool = False
) -> tuple[list, float, float]:
    """The output, wall seconds and this process's CPU seconds (steadier on a shared host)."""
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, speculative=spec)
    if sampled:  # a seeded chat-like row
        params = SamplingParams(
            max_tokens=max_tokens, temperature=0.7, top_p=0.9, seed=1234, speculative=spec
        )
    t0, c0 = time.perf_counter(), time.process_time()
    out = engine.generate([prompt], params)[0]
    return out, time.perf_counter() - t0, time.process_time() - c0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--num-speculative-tokens", type=int, default=4)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--workload", choices=sorted(ASKS), default="repeat")
    ap.add_argument("--sampled", action="store_true", help="temperature 0.7, top_p 0.9, seeded")
    a = ap.parse_args()
    engine = LLMEngine(
        EngineConfig(
            model=ModelConfig(model=a.model, num_threads=a.threads),
            scheduler=SchedulerConfig(
                speculative_method="ngram", num_speculative_tokens=a.num_speculative_tokens
            ),
        )
    )
    prompt = chat_prompt(engine.model_dir, a.workload)
    run(engine, prompt, 8, False)  # warm up
    rates: dict[bool, list[float]] = {False: [], True: []}
    cpu_rates: dict[bool, list[float]] = {False: [], True: []}
    outs: dict[bool, list[int]] = {}
    for r in range(a.rounds):
        for spec in (False, True) if r % 2 == 0 else (True, False):
            before = (engine.counters.draft_tokens, engine.counters.accepted_tokens)
            out, secs, cpu = run(engine, prompt, a.max_tokens, spec, a.sampled)
            drafted = engine.counters.draft_tokens - before[0]
            accepted = engine.counters.accepted_tokens - before[1]
            rates[spec].append(len(out) / secs)
            cpu_rates[spec].append(len(out) / cpu)
            outs.setdefault(spec, out)
            assert out == outs[spec], "outputs differ between rounds"
            print(
                f"round {r} {'ngram' if spec else 'none '}: {len(out)} tokens in {secs:.2f} s, "
                f"{len(out) / secs:.1f} tok/s, {len(out) / cpu:.1f} tok per CPU s, "
                f"drafted {drafted}, accepted {accepted}"
            )
    same = outs[True] == outs[False]
    ratio = statistics.median(rates[True]) / statistics.median(rates[False])
    print(f"cpu: {cpu_model_name()}; prompt {len(prompt)} tokens")
    med = {k: statistics.median(v) for k, v in cpu_rates.items()}
    print(
        f"median tok per CPU s: none {med[False]:.1f}, ngram {med[True]:.1f}, "
        f"ratio {med[True] / med[False]:.2f}x"
    )
    print(
        f"median tok/s: none {statistics.median(rates[False]):.1f}, ngram "
        f"{statistics.median(rates[True]):.1f}, ratio {ratio:.2f}x; outputs equal: {same}"
    )
    if not same:
        raise SystemExit("ngram output differs from the output without drafts")


if __name__ == "__main__":
    main()
