"""Speculative decoding at one stream, with a JSON schema among the workloads (bench_spec.py:
predicted outputs and sampled rows): output tok/s with and without ngram drafts in one
engine (the request's `speculative` flag switches it), alternating A/B runs, greedy; the
outputs must be equal token for token.

    python benchmarks/bench_spec_json.py --model smollm2 --rounds 4 --max-tokens 128

The `repeat` prompt asks the model to repeat a passage (prompt lookup pays there), `chat`
asks for a story (little to look up), `json` asks for an order record from the prompt back as
JSON under a schema (structured outputs: the drafts are checked against the grammar, which
refuses the prompt's spaces between tokens). Prints one line a run and the ratio of the
medians.
"""

from __future__ import annotations

import argparse
import json
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


ORDER = {
    "order_id": "A-20931",
    "customer": "Margaret Okafor",
    "email": "margaret.okafor@example.org",
    "city": "Lisbon",
    "country": "Portugal",
    "product": "ergonomic office chair",
    "quantity": 2,
    "status": "shipped",
    "carrier": "DHL Express",
    "tracking": "JD014600003828",
}
ORDER_SCHEMA = {
    "type": "object",
    "properties": {
        k: {"type": "integer" if isinstance(v, int) else "string"} for k, v in ORDER.items()
    },
    "required": list(ORDER),
    "additionalProperties": False,
}

ASKS = {
    "repeat": f"Repeat the following passage word for word.\n\n{PASSAGE}",
    # little to look up: what the drafts cost when they are refused
    "chat": "Write a short story about a dragon who learns to cook.",
    # the record as json.dumps writes it (", ", ": "); the compact grammar has no spaces
    "json": (
        f"Here is an order record from our database:\n\n{json.dumps(ORDER)}\n\n"
        "Return the record as JSON with the same fields and values."
    ),
}
# the workloads with structured outputs: SamplingParams.structured
STRUCTURED = {"json": {"kind": "json", "spec": json.dumps(ORDER_SCHEMA)}}


def chat_prompt(model_dir, workload: str = "repeat") -> list[int]:
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(model_dir)
    messages = [{"role": "user", "content": ASKS[workload]}]
    ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def run(
    engine: LLMEngine,
    prompt: list[int],
    max_tokens: int,
    spec: bool,
    structured: dict[str, str] | None = None,
) -> tuple[list, float, float]:
    """The output, wall seconds and this process's CPU seconds (steadier on a shared host)."""
    params = SamplingParams(
        max_tokens=max_tokens, temperature=0.0, speculative=spec, structured=structured
    )
    t0, c0 = time.perf_counter(), time.process_time()
    out = engine.generate([prompt], params)[0]
    return out, time.perf_counter() - t0, time.process_time() - c0


class Proposals:
    """Counts the drafter's proposals (before a grammar cuts them)."""

    def __init__(self, engine: LLMEngine) -> None:
        self.drafter, self.count = engine.scheduler.drafter, 0
        engine.scheduler.drafter = self

    def propose(self, token_ids: list[int], state: object | None, k: int):
        assert self.drafter is not None
        drafts, state = self.drafter.propose(token_ids, state, k)
        self.count += len(drafts)
        return drafts, state


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--num-speculative-tokens", type=int, default=4)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--workload", choices=sorted(ASKS), default="repeat")
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
    structured = STRUCTURED.get(a.workload)
    run(engine, prompt, 8, False, structured)  # warm up (and the grammar compiled)
    proposed = Proposals(engine)
    rates: dict[bool, list[float]] = {False: [], True: []}
    cpu_rates: dict[bool, list[float]] = {False: [], True: []}
    outs: dict[bool, list[int]] = {}
    for r in range(a.rounds):
        for spec in (False, True) if r % 2 == 0 else (True, False):
            before = (engine.counters.draft_tokens, engine.counters.accepted_tokens)
            masks, proposed.count = engine.grammars.step_time, 0
            out, secs, cpu = run(engine, prompt, a.max_tokens, spec, structured)
            drafted = engine.counters.draft_tokens - before[0]
            accepted = engine.counters.accepted_tokens - before[1]
            rates[spec].append(len(out) / secs)
            cpu_rates[spec].append(len(out) / cpu)
            outs.setdefault(spec, out)
            assert out == outs[spec], "greedy outputs differ between rounds"
            print(
                f"round {r} {'ngram' if spec else 'none '}: {len(out)} tokens in {secs:.2f} s, "
                f"{len(out) / secs:.1f} tok/s, {len(out) / cpu:.1f} tok per CPU s, "
                f"drafted {drafted}, accepted {accepted}"
            )
            if structured:  # what the grammar cut, and the time its masks took
                ms = (engine.grammars.step_time - masks) * 1e3
                print(f"  proposed {proposed.count} (the rest cut), grammar masks {ms:.1f} ms")
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
        raise SystemExit("ngram output differs from the plain greedy output")


if __name__ == "__main__":
    main()
