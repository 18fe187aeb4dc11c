"""Drafters replayed over fixed greedy outputs: what a drafter can accept on a workload,
load-free.

Greedy output with drafts equals the output without (the verify is exact), so a drafter's
proposals and acceptances follow from the plain output alone: this bench generates each
prompt's greedy output once, then replays the drafters over it step by step (a step
proposes up to k tokens, with no policy cutting k; it accepts the longest agreeing prefix
plus one token), printing steps, drafted and accepted tokens. `best` takes, each step,
whichever of the prediction and prompt lookup accepts more: no drafter choosing between
the two does better. The modelled ratio prices a step of d drafts at 1 + c1 + c2 * d
decode steps (d > 0), from `bench_spec_verify.py --costs` on the machine at hand.

    python benchmarks/bench_spec_replay.py --workload edit --k 4 8 --c1 0.3 --c2 0.06
"""

from __future__ import annotations

import argparse
import time

try:
    from bench_spec import WORKLOADS, generate, prompts
    from bench_spec_methods import workload_prompts
except ImportError:  # run as a module of the benchmarks package
    from benchmarks.bench_spec import WORKLOADS, generate, prompts  # type: ignore[no-redef]
    from benchmarks.bench_spec_methods import workload_prompts  # type: ignore[no-redef]
from common.config import EngineConfig, ModelConfig, SchedulerConfig
from common.sampling_params import SamplingParams
from scheduler_worker.engine import LLMEngine
from scheduler_worker.spec import make_drafter
from scheduler_worker.spec.prediction import Prediction


def _accepted(drafts: list[int], out: list[int], n: int) -> int:
    a = 0
    while a < len(drafts) and n + a < len(out) and drafts[a] == out[n + a]:
        a += 1
    return a


def replay(
    work: list[tuple[list[int], list[int] | None, list[int]]], method: str, k: int
) -> tuple[int, int, int, int, int]:
    """(tokens, steps, drafting steps, drafted, accepted) of one method over the outputs, the
    requests in order (suffix: its store fed each finished request, as the engine does).
    prediction: the request's prediction first, else prompt lookup (spec.propose's order);
    best: each step, whichever of those two accepts more."""
    tokens = steps = drafting = drafted = accepted = 0
    drafter = make_drafter("ngram" if method in ("prediction", "best") else method)
    assert drafter is not None
    for prompt, pred, out in work:
        prediction = Prediction(pred, len(prompt)) if pred is not None else None
        use_prediction = prediction is not None and method in ("prediction", "best")
        state: object | None = None
        n = 0
        while n < len(out):
            ids = prompt + out[:n]
            p = prediction.propose(ids, k) if use_prediction and prediction else []
            g: list[int] = []
            if not p or method == "best":
                g, state = drafter.propose(ids, state, k)
            if method == "best":
                d = p if _accepted(p, out, n) >= _accepted(g, out, n) else g
            else:
                d = p or g
            a = _accepted(d, out, n)
            steps, drafting = steps + 1, drafting + (1 if d else 0)
            drafted, accepted = drafted + len(d), accepted + a
            n += a + 1
        drafter.observe(prompt, out)
        tokens += len(out)
    return tokens, steps, drafting, drafted, accepted


def workload(model_dir, name: str) -> list[tuple[list[int], list[int] | None]]:
    if name in WORKLOADS:  # bench_spec's: edit (with a prediction), edit-lookup, repeat, chat
        return prompts(model_dir, name)
    return [(p, None) for p in workload_prompts(model_dir, name)]  # agent, extract


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--workload", default="edit", choices=sorted({*WORKLOADS, "agent", "extract"}))
    ap.add_argument("--methods", default="ngram,suffix,prediction,best")
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--k", type=int, nargs="+", default=[4, 8])
    ap.add_argument("--c1", type=float, default=0.3, help="a verify step's fixed extra cost")
    ap.add_argument("--c2", type=float, default=0.06, help="a draft token's extra cost")
    ap.add_argument("--threads", type=int, default=None)
    a = ap.parse_args()
    engine = LLMEngine(
        EngineConfig(
            model=ModelConfig(model=a.model, num_threads=a.threads),
            scheduler=SchedulerConfig(speculative_method="none"),
        )
    )
    params = SamplingParams(max_tokens=a.max_tokens, temperature=0.0)
    work = []
    for prompt, pred in workload(engine.model_dir, a.workload):
        t0 = time.perf_counter()
        out = generate(engine, prompt, params, None)
        print(f"prompt of {len(prompt)} tokens: {len(out)} out in {time.perf_counter() - t0:.1f} s")
        work.append((prompt, pred, out))
    with_prediction = any(pred is not None for _, pred, _ in work)
    methods = [
        m for m in a.methods.split(",") if with_prediction or m not in ("prediction", "best")
    ]
    for k in a.k:
        for method in methods:
            tokens, steps, drafting, drafted, accepted = replay(work, method, k)
            cost = steps + drafting * a.c1 + drafted * a.c2
            print(
                f"{a.workload} k={k} {method}: {tokens} tokens in {steps} steps "
                f"({tokens / steps:.2f} a step), drafted {drafted}, accepted {accepted} "
                f"({accepted / max(drafted, 1):.0%}); modelled {tokens / cost:.2f}x"
            )


if __name__ == "__main__":
    main()
