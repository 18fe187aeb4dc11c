"""The CPU's verify step: as 1 + k decode rows in the one-call decode step (spec/verify_rows.py)
against the prompt path's chunk (the path before issue 53 item 6), in one process.

    python benchmarks/bench_spec_verify.py --costs --rows 1 8 --context 800
    python benchmarks/bench_spec_verify.py --costs --model /tmp/l1b --load-format dummy \
        --device cuda --paths rows --num-speculative-tokens 1 3 7    # the GPU check's
    python benchmarks/bench_spec_verify.py --workload edit edit-lookup agent --max-tokens 256

--costs: per step of N rows at a context of C tokens, the wall and CPU seconds of a plain
decode step and of a verify step (each row 1 + k tokens) by either path (--paths),
alternated, and each verify's cost in plain decode steps (medians); on a GPU each step is
timed to its end on the device (synchronized), and a verify as decode rows replays the
decode graph of rows x (1 + k) rows (issue 53's GPU target: <= 1.15 decode steps at one row
for k <= 7). --workload: greedy runs at one stream
(each prompt prefilled once first, so that every run reads it from the prefix cache alike),
alternated three ways: no drafts, drafts verified as a chunk, drafts verified as decode rows
(edit, edit-lookup: bench_spec.py's ngram and prediction drafts; agent: suffix drafts);
output tok/s and tok per CPU s, drafted and accepted counts, and whether each drafted run's
text equals the plain run's.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

try:
    import bench_spec
    import bench_spec_methods
except ImportError:  # run as a module: python -m benchmarks.bench_spec_verify
    from benchmarks import bench_spec, bench_spec_methods  # type: ignore[no-redef]
from common.config import EngineConfig, ModelConfig, SchedulerConfig
from common.cpu import cpu_model_name
from common.sampling_params import SamplingParams
from scheduler_worker.backends.base import SeqInput
from scheduler_worker.engine import LLMEngine


def step_costs(
    engine: LLMEngine, rows: int, context: int, k: int, reps: int, paths: tuple[str, ...]
) -> None:
    """Plain decode vs verify (`paths`: chunk, decode rows) steps of `rows` rows at
    `context`."""
    runner, bs = engine.runner, engine.config.cache.block_size
    on_gpu = runner.backend.name == "cuda"
    sync = torch.cuda.synchronize if on_gpu else (lambda: None)
    per_row = -(-(context + k + 1) // bs)
    tables = [list(range(1 + i * per_row, 1 + (i + 1) * per_row)) for i in range(rows)]
    prompt = [(7 * j) % 1000 + 100 for j in range(context)]
    for t in tables:  # the rows' contexts, in chunks
        for s in range(0, context, 256):
            runner.execute([SeqInput(prompt[s : s + 256], s, t, sample=s + 256 >= context)])
    vocab = runner.vocab_size
    drafted = [100 + j for j in range(k + 1)]

    def plain() -> None:
        runner.execute([SeqInput([100], context, t) for t in tables], vocab)

    def verify(as_rows: bool) -> None:
        runner.backend.verify_as_decode_rows = as_rows
        seqs = [SeqInput(drafted, context, t, True, k, -1, -1, True, True) for t in tables]
        runner.execute_with_prompt_logits(seqs, vocab)

    every = {"decode": plain, "chunk": lambda: verify(False), "rows": lambda: verify(True)}
    cases = {c: f for c, f in every.items() if c == "decode" or c in paths}
    for fn in cases.values():  # a first call of each shape (a graph's, a kernel's) untimed
        fn()
    sync()
    wall: dict[str, list[float]] = {c: [] for c in cases}
    cpu: dict[str, list[float]] = {c: [] for c in cases}
    for r in range(reps):
        for name in cases if r % 2 == 0 else reversed(cases):
            t0, c0 = time.perf_counter(), time.process_time()
            cases[name]()
            sync()
            wall[name].append(time.perf_counter() - t0)
            cpu[name].append(time.process_time() - c0)
    runner.backend.verify_as_decode_rows = True
    med = {c: statistics.median(wall[c]) for c in cases}
    cmed = {c: statistics.median(cpu[c]) for c in cases}
    spread = {c: (min(wall[c]) * 1e3, max(wall[c]) * 1e3) for c in cases}
    line = (
        f"rows {rows}, context {context}, k {k}, {reps} reps: decode {med['decode'] * 1e3:.2f} ms "
        f"(wall; {spread['decode'][0]:.2f}-{spread['decode'][1]:.2f})"
    )
    for c in (c for c in cases if c != "decode"):
        line += (
            f", {c} verify {med[c] * 1e3:.2f} ms ({spread[c][0]:.2f}-{spread[c][1]:.2f}) = "
            f"{med[c] / med['decode']:.2f} decode steps"
        )
    cpu_line = ", ".join(f"{c} {cmed[c] / cmed['decode']:.2f}" for c in cases if c != "decode")
    print(f"{line}; CPU s: {cpu_line} decode steps", flush=True)


def workload_runs(engine: LLMEngine, workload: str, rounds: int, max_tokens: int) -> None:
    """Alternated runs: none, spec with chunk verify, spec with decode-row verify."""
    if workload == "agent":
        prompts = [
            (p, None) for p in bench_spec_methods.workload_prompts(engine.model_dir, "agent")
        ]
    else:
        prompts = bench_spec.prompts(engine.model_dir, workload)[:1]
    cases = ["none", "chunk", "rows"]
    warm = SamplingParams(max_tokens=1, temperature=0.0, speculative=False)
    for p, _ in prompts:  # every run's prompt from the prefix cache alike (untimed)
        bench_spec.generate(engine, p, warm, None)
    rates: dict[str, list[float]] = {c: [] for c in cases}
    cpu_rates: dict[str, list[float]] = {c: [] for c in cases}
    outs: dict[str, list[list[int]]] = {}
    for r in range(rounds):
        for case in cases if r % 2 == 0 else reversed(cases):
            if workload == "agent":  # a fresh suffix store a run (bench_spec_methods.run)
                engine.scheduler.drafter = bench_spec_methods.make_method_drafter("suffix")
            engine.runner.backend.verify_as_decode_rows = case == "rows"
            before = (engine.counters.draft_tokens, engine.counters.accepted_tokens)
            params = SamplingParams(
                max_tokens=max_tokens, temperature=0.0, speculative=case != "none"
            )
            t0, c0 = time.perf_counter(), time.process_time()
            out = [
                bench_spec.generate(engine, p, params, None if case == "none" else pred)
                for p, pred in prompts
            ]
            secs, cpu = time.perf_counter() - t0, time.process_time() - c0
            n = sum(map(len, out))
            rates[case].append(n / secs)
            cpu_rates[case].append(n / cpu)
            outs.setdefault(case, out)
            drafted = engine.counters.draft_tokens - before[0]
            accepted = engine.counters.accepted_tokens - before[1]
            print(
                f"{workload} round {r} {case}: {n} tokens in {secs:.1f} s, {n / secs:.1f} tok/s, "
                f"{n / cpu:.1f} tok per CPU s, drafted {drafted}, accepted {accepted}",
                flush=True,
            )
    engine.runner.backend.verify_as_decode_rows = True
    med = {c: statistics.median(rates[c]) for c in cases}
    cmed = {c: statistics.median(cpu_rates[c]) for c in cases}
    print(
        f"{workload}: median tok/s none {med['none']:.1f}, chunk {med['chunk']:.1f} "
        f"({med['chunk'] / med['none']:.2f}x), rows {med['rows']:.1f} ({med['rows'] / med['none']:.2f}x); "
        f"per CPU s: chunk {cmed['chunk'] / cmed['none']:.2f}x, rows {cmed['rows'] / cmed['none']:.2f}x; "
        f"equal to none: chunk {outs['chunk'] == outs['none']}, rows {outs['rows'] == outs['none']}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--costs", action="store_true", help="the steps' costs")
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--context", type=int, default=800)
    ap.add_argument("--num-speculative-tokens", type=int, nargs="+", default=[4], help="k: each")
    ap.add_argument("--paths", default="chunk,rows", help="the verify paths timed (--costs)")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--load-format", default="auto", help="dummy: random weights from config.json")
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--workload", nargs="*", default=[], choices=["edit", "edit-lookup", "agent"])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--policy", default="always", choices=["always", "adaptive"])
    a = ap.parse_args()
    if a.threads is not None:  # the offline engine leaves torch's pool as it is
        torch.set_num_threads(a.threads)
    ks = a.num_speculative_tokens
    model = ModelConfig(
        model=a.model, num_threads=a.threads, device=a.device, load_format=a.load_format
    )
    engine = LLMEngine(
        EngineConfig(
            model=model,
            scheduler=SchedulerConfig(
                speculative_method="ngram",
                num_speculative_tokens=max(ks),
                speculative_policy=a.policy,
            ),
        )
    )
    gpu = torch.cuda.get_device_name() if engine.runner.backend.name == "cuda" else "none"
    print(f"cpu {cpu_model_name()}, gpu {gpu}, backend {engine.runner.backend.name}")
    if a.costs:
        paths = tuple(a.paths.split(","))
        for rows in a.rows:
            for k in ks:
                step_costs(engine, rows, a.context, k, a.reps, paths)
    for workload in a.workload:
        workload_runs(engine, workload, a.rounds, a.max_tokens)


if __name__ == "__main__":
    main()
