"""Speculative decoding by method at one stream: output tok/s with each drafter (ngram,
suffix, draft: --draft-model) against none in one engine (the request's `speculative` flag switches it; each
method's drafter set per run), alternating runs, greedy; the outputs must be equal token
for token. (bench_spec.py: predicted outputs and sampled rows.)

    python benchmarks/bench_spec_methods.py --workload agent --methods ngram,suffix --max-tokens 256
    python benchmarks/bench_spec_methods.py --workload chat --methods draft --draft-model smollm2 \
        --dtype float32 --quantization none   # the Q4_1 file drafting for float32 weights

The `repeat` prompt asks the model to repeat a passage (prompt lookup pays there), `chat`
asks for a story (little to look up); `agent` and `extract` (benchmarks/spec_workloads.py)
are several requests run one after another. Prints one line a run and the ratios of the
medians, each method against none.
"""

from __future__ import annotations

import argparse
import statistics
import time

from common.config import EngineConfig, ModelConfig, SchedulerConfig
from common.cpu import cpu_model_name
from common.sampling_params import SamplingParams
from scheduler_worker.engine import LLMEngine
from scheduler_worker.spec import Drafter, make_drafter

try:
    from benchmarks.spec_workloads import WORKLOADS
except ImportError:  # run as a script: benchmarks/ is on the path
    from spec_workloads import WORKLOADS  # type: ignore[no-redef]

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
    return chat_prompts(model_dir, [[{"role": "user", "content": ASKS[workload]}]])[0]


def chat_prompts(model_dir, conversations: list[list[dict]]) -> list[list[int]]:
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(model_dir)
    out = []
    for messages in conversations:
        ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        out.append(list(ids["input_ids"] if hasattr(ids, "keys") else ids))
    return out


def workload_prompts(model_dir, workload: str) -> list[list[int]]:
    """The workload's requests (token ids), run one after another in this order."""
    if workload in ASKS:
        return [chat_prompt(model_dir, workload)]
    return chat_prompts(model_dir, WORKLOADS[workload]())


def make_method_drafter(method: str) -> Drafter | None:
    """A fresh drafter a run: the suffix store starts empty, so that a run learns only
    from its own earlier requests, never from the previous run's same outputs."""
    return None if method == "none" else make_drafter(method)


def run(
    engine: LLMEngine,
    prompts: list[list[int]],
    max_tokens: int,
    method: str,
    draft: Drafter | None = None,
) -> tuple[list[list[int]], float, float, float]:
    """The outputs, wall seconds, this process's CPU seconds (steadier on a shared host)
    and the wall seconds before each request's first token (prefill), summed. `draft`:
    the engine's draft-model drafter, kept across runs (its model loads once)."""
    engine.scheduler.drafter = draft if method == "draft" else make_method_drafter(method)
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, speculative=method != "none")
    outs: list[list[int]] = []
    t0, c0 = time.perf_counter(), time.process_time()
    first = 0.0
    for i, prompt in enumerate(prompts):
        t = time.perf_counter()
        engine.add_request(f"{method}-{i}", prompt, params)
        out: list[int] = []
        while engine.has_unfinished():
            for o in engine.step():
                if not out and o.new_token_ids:
                    first += time.perf_counter() - t
                out += o.new_token_ids
        outs.append(out)
    return outs, time.perf_counter() - t0, time.process_time() - c0, first


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--num-speculative-tokens", type=int, default=4)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--workload", choices=sorted([*ASKS, *WORKLOADS]), default="repeat")
    ap.add_argument("--methods", default="ngram", help="comma-separated, each against none")
    ap.add_argument("--draft-model", default=None, help="method draft's model (GGUF, alias, dir)")
    ap.add_argument("--policy", default="adaptive", choices=["adaptive", "always"])
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--quantization", default="auto")
    a = ap.parse_args()
    methods = ["none", *a.methods.split(",")]
    if ("draft" in methods) != (a.draft_model is not None):
        raise SystemExit("--methods draft and --draft-model go together")
    engine = LLMEngine(
        EngineConfig(
            model=ModelConfig(
                model=a.model, num_threads=a.threads, dtype=a.dtype, quantization=a.quantization
            ),
            scheduler=SchedulerConfig(
                speculative_method="draft" if a.draft_model else methods[1],
                speculative_model=a.draft_model,
                num_speculative_tokens=a.num_speculative_tokens,
                speculative_policy=a.policy,
            ),
        )
    )
    draft = engine.scheduler.drafter if a.draft_model else None
    prompts = workload_prompts(engine.model_dir, a.workload)
    run(engine, prompts[:1], 8, "none")  # warm up
    rates: dict[str, list[float]] = {m: [] for m in methods}
    cpu_rates: dict[str, list[float]] = {m: [] for m in methods}
    decode_rates: dict[str, list[float]] = {m: [] for m in methods}
    outs: dict[str, list[list[int]]] = {}
    for r in range(a.rounds):
        for method in methods if r % 2 == 0 else methods[::-1]:
            before = (engine.counters.draft_tokens, engine.counters.accepted_tokens)
            out, secs, cpu, first = run(engine, prompts, a.max_tokens, method, draft)
            drafted = engine.counters.draft_tokens - before[0]
            accepted = engine.counters.accepted_tokens - before[1]
            n = sum(map(len, out))
            rates[method].append(n / secs)
            cpu_rates[method].append(n / cpu)
            decode_rates[method].append((n - len(out)) / (secs - first))
            outs.setdefault(method, out)
            assert out == outs[method], "greedy outputs differ between rounds"
            print(
                f"round {r} {method:6}: {n} tokens in {secs:.2f} s, {n / secs:.1f} tok/s, "
                f"{n / cpu:.1f} tok per CPU s, decode {decode_rates[method][-1]:.1f} tok/s, "
                f"drafted {drafted}, accepted {accepted}",
                flush=True,
            )
    lens = sorted(map(len, prompts))
    print(
        f"cpu: {cpu_model_name()}; workload {a.workload}: {len(prompts)} request(s), prompts "
        f"{lens[0]}-{lens[-1]} tokens, outputs {sorted(map(len, outs['none']))} tokens"
    )
    med = {m: statistics.median(v) for m, v in rates.items()}
    cpu_med = {m: statistics.median(v) for m, v in cpu_rates.items()}
    dec_med = {m: statistics.median(v) for m, v in decode_rates.items()}
    spread = [f"{m} {med[m]:.1f} ({min(rates[m]):.1f}-{max(rates[m]):.1f})" for m in methods]
    print(f"median tok/s (range): {', '.join(spread)}")
    bad = []
    for m in methods[1:]:
        same = outs[m] == outs["none"]
        print(
            f"{m} vs none: {med[m] / med['none']:.2f}x wall, "
            f"{cpu_med[m] / cpu_med['none']:.2f}x CPU s, "
            f"{dec_med[m] / dec_med['none']:.2f}x decode (after the first token); "
            f"outputs equal: {same}"
        )
        bad += [] if same else [m]
    if bad:
        raise SystemExit(f"{', '.join(bad)} output differs from the plain greedy output")


if __name__ == "__main__":
    main()
