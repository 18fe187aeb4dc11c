"""Speculative decoding at one stream: output tok/s with and without drafts in one engine
(the request's `speculative` flag switches it), alternating A/B runs, greedy; the outputs
must be equal token for token (`--sampled`: temperature 0.7, top_p 0.9, a seed).

    python benchmarks/bench_spec.py --model smollm2 --rounds 4 --max-tokens 128
    python benchmarks/bench_spec.py --workload edit edit-lookup --max-tokens 256

The `repeat` prompt asks the model to repeat a passage (prompt lookup pays there), `chat`
asks for a story (little to look up); `edit` asks for a rename in a source file
(benchmarks/data/edit_inventory.py.txt) with the file as the prediction (OpenAI's
Predicted Outputs), `edit-lookup` the same without it (ngram drafts from the prompt's
copy); `self` the chat prompt with its own output as the prediction (every draft
accepted: the verify's best case, even on random weights). Prints one line a run and the
ratio of the medians, per workload.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

from common.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from common.cpu import cpu_model_name
from common.sampling_params import SamplingParams
from scheduler_worker.engine import LLMEngine

try:
    from benchmarks.spec_workloads import edit_asks
except ImportError:  # run as a script: benchmarks/ is on the path
    from spec_workloads import edit_asks  # type: ignore[no-redef]

PASSAGE = (
    "The committee met on Tuesday to review the budget for the coming year. After a long "
    "discussion, the members agreed to increase the funding for the public library by ten "
    "percent, to repair the bridge over the river before the winter, and to hire two more "
    "teachers for the primary school. The mayor thanked everyone for their work and said "
    "that the town would publish the full report on its website next week."
)


# workload -> (the user's message, the prediction or None) a prompt
WORKLOADS: dict[str, Callable[[], list[tuple[str, str | None]]]] = {
    "repeat": lambda: [(f"Repeat the following passage word for word.\n\n{PASSAGE}", None)],
    # little to look up: what the drafts cost when they are refused
    "chat": lambda: [("Write a short story about a dragon who learns to cook.", None)],
    # predicted outputs: the file as `prediction`; edit-lookup: the same, prompt lookup only
    "edit": lambda: edit_asks(True),
    "edit-lookup": lambda: edit_asks(False),
    # the chat prompt with the model's own output (a first plain run) as its prediction:
    # every draft accepted, the verify's best case whatever the weights (a GPU's m135)
    "self": lambda: [("Write a short story about a dragon who learns to cook.", None)],
}


def prompts(model_dir, workload: str) -> list[tuple[list[int], list[int] | None]]:
    """(chat prompt ids, prediction ids or None) of each of the workload's prompts."""
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(model_dir)
    out = []
    for ask, prediction in WORKLOADS[workload]():
        messages = [{"role": "user", "content": ask}]
        ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        pred = None if prediction is None else tok.encode(prediction, add_special_tokens=False)
        out.append((list(ids["input_ids"] if hasattr(ids, "keys") else ids), pred))
    return out


def run(
    engine: LLMEngine,
    work: list[tuple[list[int], list[int] | None]],
    max_tokens: int,
    spec: bool,
    sampled: bool = False,
) -> tuple[list[list[int]], float, float, float]:
    """The outputs (one prompt at a time: one stream), wall seconds, this process's CPU
    seconds (steadier on a shared host) and the wall seconds before each request's first
    token (its prefill), summed."""
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, speculative=spec)
    if sampled:  # a seeded chat-like row
        params = SamplingParams(
            max_tokens=max_tokens, temperature=0.7, top_p=0.9, seed=1234, speculative=spec
        )
    t0, c0 = time.perf_counter(), time.process_time()
    outs, first = [], 0.0
    for p, pred in work:
        t = time.perf_counter()
        outs.append(generate(engine, p, params, pred if spec else None, firsts := []))
        first += firsts[0] - t if firsts else 0.0
    return outs, time.perf_counter() - t0, time.process_time() - c0, first


def generate(
    engine: LLMEngine,
    prompt: list[int],
    params: SamplingParams,
    prediction: list[int] | None,
    first: list[float] | None = None,
) -> list[int]:
    """One request to its end (LLMEngine.generate, with a prediction); `first` gets the
    perf_counter time of its first token."""
    rid = f"bench-{time.monotonic_ns()}"
    engine.add_request(rid, prompt, params, prediction=prediction)
    out: list[int] = []
    while engine.has_unfinished():
        for o in engine.step():
            if o.request_id == rid:
                if first is not None and not out and o.new_token_ids:
                    first.append(time.perf_counter())
                out += o.new_token_ids
    return out


def measure(
    engine: LLMEngine,
    workload: str,
    rounds: int,
    max_tokens: int,
    num_prompts: int | None,
    sampled: bool = False,
) -> bool:
    """Alternating A/B rounds of one workload (its first num_prompts prompts, None: all);
    prints a line a run and the medians' ratio. Returns whether the outputs were equal."""
    work = prompts(engine.model_dir, workload)[:num_prompts]
    if workload == "self":  # each prompt's own output predicted (sampled: the seeded one)
        own = run(engine, work, max_tokens, False, sampled)[0]
        work = [(p, out) for (p, _), out in zip(work, own)]
    rates: dict[bool, list[float]] = {False: [], True: []}
    cpu_rates: dict[bool, list[float]] = {False: [], True: []}
    decode_rates: dict[bool, list[float]] = {False: [], True: []}
    outs: dict[bool, list[list[int]]] = {}
    for r in range(rounds):
        for spec in (False, True) if r % 2 == 0 else (True, False):
            before = (engine.counters.draft_tokens, engine.counters.accepted_tokens)
            out, secs, cpu, first = run(engine, work, max_tokens, spec, sampled)
            drafted = engine.counters.draft_tokens - before[0]
            accepted = engine.counters.accepted_tokens - before[1]
            n = sum(map(len, out))
            rates[spec].append(n / secs)
            cpu_rates[spec].append(n / cpu)
            decode_rates[spec].append((n - len(out)) / (secs - first))
            outs.setdefault(spec, out)
            assert out == outs[spec], "greedy outputs differ between rounds"
            print(
                f"{workload} round {r} {'spec' if spec else 'none'}: {n} tokens in "
                f"{secs:.2f} s, {n / secs:.1f} tok/s, {n / cpu:.1f} tok per CPU s, "
                f"decode {decode_rates[spec][-1]:.1f} tok/s, "
                f"drafted {drafted}, accepted {accepted}"
            )
    same = outs[True] == outs[False]
    dec = {k: statistics.median(v) for k, v in decode_rates.items()}
    print(
        f"{workload}: median decode tok/s (after each request's first token): none "
        f"{dec[False]:.1f}, spec {dec[True]:.1f}, ratio {dec[True] / dec[False]:.2f}x"
    )
    ratio = statistics.median(rates[True]) / statistics.median(rates[False])
    sizes = ", ".join(str(len(p)) for p, _ in work)
    print(f"{workload}: {device_label(engine)}; prompts of {sizes} tokens")
    med = {k: statistics.median(v) for k, v in cpu_rates.items()}
    print(
        f"{workload}: median tok per CPU s: none {med[False]:.1f}, spec {med[True]:.1f}, "
        f"ratio {med[True] / med[False]:.2f}x"
    )
    print(
        f"{workload}: median tok/s: none {statistics.median(rates[False]):.1f}, spec "
        f"{statistics.median(rates[True]):.1f}, ratio {ratio:.2f}x; outputs equal: {same}"
    )
    if not same:
        first = next(i for i, (a, b) in enumerate(zip(outs[True], outs[False])) if a != b)
        a, b = outs[True][first], outs[False][first]
        at = next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        print(f"{workload}: prompt {first} differs first at output token {at}")
    return same


def device_label(engine: LLMEngine) -> str:
    """The device the figures ran on: the GPU's name (the host's CPU beside it), or the CPU."""
    if engine.runner.backend.name == "cuda":
        import torch

        return f"gpu {torch.cuda.get_device_name()} (host cpu {cpu_model_name()})"
    return f"cpu {cpu_model_name()}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--num-speculative-tokens", type=int, default=4)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--workload", choices=sorted(WORKLOADS), nargs="+", default=["repeat"])
    ap.add_argument("--prompts", type=int, default=None, help="each workload's first N prompts")
    ap.add_argument("--sampled", action="store_true", help="temperature 0.7, top_p 0.9, seeded")
    ap.add_argument("--device", default="auto", help="a GPU's: overlapped, spec/overlap.py")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--async-scheduling", default="auto", choices=("auto", "on", "off"))
    a = ap.parse_args()
    engine = LLMEngine(
        EngineConfig(
            model=ModelConfig(model=a.model, num_threads=a.threads, device=a.device, dtype=a.dtype),
            # every run prefills its prompts: a prompt computed afresh and one read back
            # from the prefix cache may round apart and flip a near-tie token, which made
            # the rounds' greedy texts differ by what the cache happened to hold
            cache=CacheConfig(enable_prefix_caching=False),
            scheduler=SchedulerConfig(
                speculative_method="ngram",
                num_speculative_tokens=a.num_speculative_tokens,
                async_scheduling=a.async_scheduling,
            ),
        )
    )
    engine.generate([[1, 2, 3]], SamplingParams(max_tokens=8, temperature=0.0))  # warm up
    equal = [measure(engine, w, a.rounds, a.max_tokens, a.prompts, a.sampled) for w in a.workload]
    print(
        f"overlapped: {engine.overlap}; steps that resolved the one in flight to draft: "
        f"{engine.gate.tries}"
    )
    if not all(equal):
        raise SystemExit("output with drafts differs from the plain greedy output")


if __name__ == "__main__":
    main()
