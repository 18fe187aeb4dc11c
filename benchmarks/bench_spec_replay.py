"""Drafters replayed over fixed greedy outputs: what a drafter can accept on a workload,
load-free.

Greedy output with drafts equals the output without (the verify is exact), so a drafter's
proposals and acceptances follow from the plain output alone: this bench generates each
prompt's greedy output once, then replays the drafters over it step by step (a step
proposes up to k tokens, accepts the longest agreeing prefix plus one token), printing
steps, drafted and accepted tokens. `best` takes, each step, whichever of the prediction
and prompt lookup accepts more: no drafter choosing between the two does better. The
modelled ratio prices a step of d drafts at 1 + c1 + c2 * d decode steps (d > 0), from
`bench_spec_verify.py --costs` on the machine at hand.

    python benchmarks/bench_spec_replay.py --workload edit --k 4 8 --c1 0.3 --c2 0.06
"""

from __future__ import annotations

import argparse
import time

try:
    from bench_spec import generate, prompts
except ImportError:  # run as a module of the benchmarks package
    from benchmarks.bench_spec import generate, prompts  # type: ignore[no-redef]
from common.config import EngineConfig, ModelConfig, SchedulerConfig
from common.sampling_params import SamplingParams
from scheduler_worker.engine import LLMEngine
from scheduler_worker.spec.ngram import NgramDrafter
from scheduler_worker.spec.prediction import Prediction


def _accepted(drafts: list[int], out: list[int], n: int) -> int:
    a = 0
    while a < len(drafts) and n + a < len(out) and drafts[a] == out[n + a]:
        a += 1
    return a


def replay(
    work: list[tuple[list[int], list[int] | None, list[int]]], method: str, k: int
) -> tuple[int, int, int, int, int]:
    """(tokens, steps, drafting steps, drafted, accepted) of one drafter over the outputs."""
    tokens = steps = drafting = drafted = accepted = 0
    for prompt, pred, out in work:
        prediction = Prediction(pred, len(prompt)) if pred is not None else None
        lookup, state = NgramDrafter(), None
        n = 0
        while n < len(out):
            ids = prompt + out[:n]
            p = prediction.propose(ids, k) if prediction and method != "ngram" else []
            g, state = lookup.propose(ids, state, k)
            if method == "best":
                d = p if _accepted(p, out, n) >= _accepted(g, out, n) else g
            else:  # the engine's order (spec.propose): the prediction's, else lookup's
                d = p or g
            a = _accepted(d, out, n)
            steps, drafting = steps + 1, drafting + (1 if d else 0)
            drafted, accepted = drafted + len(d), accepted + a
            n += a + 1
        tokens += len(out)
    return tokens, steps, drafting, drafted, accepted


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--workload", default="edit", choices=["edit", "edit-lookup", "repeat"])
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
    for prompt, pred in prompts(engine.model_dir, a.workload):
        t0 = time.perf_counter()
        out = generate(engine, prompt, params, None)
        print(f"prompt of {len(prompt)} tokens: {len(out)} out in {time.perf_counter() - t0:.1f} s")
        work.append((prompt, pred, out))
    methods = ["ngram"] + (["prediction", "best"] if a.workload == "edit" else [])
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
