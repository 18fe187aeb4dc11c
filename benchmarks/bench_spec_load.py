"""Speculative decoding under load: output tok/s of N concurrent streams with each method's
drafts (ngram, suffix; a draft model's: --draft-model) (the adaptive switch,
spec/policy.py, or every draft) against none, in one engine (the request's `speculative`
flag switches it; a fresh model-free drafter a run), greedy; the outputs must be equal
token for token. Each method keeps a policy of its own (as a server running only it
would: the plain runs neither feed nor clock a method's fit) and a round runs the methods
in rotated order (none first and last in every round could bias the ratios: docs/
benchmarks.md, "Speculation policy, seventh session"). `--control` times none twice a round (`none'`):
its ratio to none is the cell's noise floor.

    python benchmarks/bench_spec_load.py --streams 1,8,32 --workload repeat,chat
    python benchmarks/bench_spec_load.py --streams 8,32 --methods ngram,suffix \
        --workload extract,edit-lookup,agent,chat --max-tokens 64 --rounds 2
    python benchmarks/bench_spec_load.py --streams 1,8 --draft-model smollm2 \
        --dtype float16 --quantization none   # the Q4_1 file drafting for float16 weights

`repeat` asks each stream to repeat its own paragraph of the shipped Pride and Prejudice
text (prompt lookup pays), `chat` for a story on its own subject (little to look up);
`extract`, `edit-lookup` and `agent` are bench_spec's workloads (spec_workloads.py), their
requests dealt out to the streams in turn (so at 32 streams a prompt runs several times at
once). Prints one line a run and, per streams x workload, each method's ratio of the
medians (tokens per CPU second of this process, and wall).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from common import collector
from common.config import EngineConfig, ModelConfig, SchedulerConfig
from common.cpu import cpu_model_name
from common.sampling_params import SamplingParams
from scheduler_worker.engine import LLMEngine
from scheduler_worker.spec import make_drafter
from scheduler_worker.spec.policy import SpecPolicy

try:
    from benchmarks.spec_workloads import WORKLOADS
except ImportError:  # run as a script: benchmarks/ is on the path
    from spec_workloads import WORKLOADS  # type: ignore[no-redef]

TEXT = Path(__file__).parent / "data" / "pride_and_prejudice_ch1-6.txt"
SUBJECTS = [
    "a dragon who learns to cook", "a lighthouse keeper", "a lost robot", "a clockmaker",
    "a city under the sea", "a talking cat", "a winter festival", "a desert caravan",
]  # fmt: skip


def conversations(workload: str, n: int) -> list[list[dict]]:
    """The n streams' chats: each its own (repeat, chat) or the workload's in turn."""
    if workload in WORKLOADS:
        chats = WORKLOADS[workload]()
        return [chats[i % len(chats)] for i in range(n)]
    paragraphs = [p for p in TEXT.read_text().split("\n\n") if 300 < len(p) < 900]
    asks = [
        f"Repeat the following passage word for word.\n\n{paragraphs[i % len(paragraphs)]}"
        if workload == "repeat"
        else f"Write a short story about {SUBJECTS[i % len(SUBJECTS)]} (take {i})."
        for i in range(n)
    ]
    return [[{"role": "user", "content": ask}] for ask in asks]


def prompts(tok, workload: str, n: int) -> list[list[int]]:
    out = []
    for messages in conversations(workload, n):
        ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        out.append(list(ids["input_ids"] if hasattr(ids, "keys") else ids))
    return out


def run(engine: LLMEngine, batch: list[list[int]], max_tokens: int, method: str, draft):
    """The outputs, output tokens per wall second and per CPU second of this process.
    `draft`: the draft model's drafter, kept across runs (its model loads once)."""
    spec = not method.startswith("none")
    # a fresh suffix store a run: it learns only from this run's requests; none: no drafter
    # (its steps take the plain path, as a server's without speculation)
    engine.scheduler.drafter = (
        draft if method == "draft" else make_drafter(method) if spec else None
    )
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, speculative=spec)
    t0, c0 = time.perf_counter(), time.process_time()
    outs = engine.generate(batch, params)
    n = sum(map(len, outs))
    return outs, n / (time.perf_counter() - t0), n / (time.process_time() - c0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--streams", default="1,8,32")
    ap.add_argument(
        "--workload", default="repeat,chat", help=f"repeat, chat, {', '.join(WORKLOADS)}"
    )
    ap.add_argument("--methods", default="ngram", help="ngram, suffix: each against none")
    ap.add_argument("--policy", choices=("adaptive", "always"), default="adaptive")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--num-speculative-tokens", type=int, default=4)
    ap.add_argument("--draft-model", default=None, help="drafts from this model (method draft)")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--quantization", default="auto")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--control", action="store_true", help="none twice a round (none')")
    a = ap.parse_args()
    methods = ["draft"] if a.draft_model else a.methods.split(",")
    engine = LLMEngine(
        EngineConfig(
            model=ModelConfig(
                model=a.model, dtype=a.dtype, quantization=a.quantization, num_threads=a.threads
            ),
            scheduler=SchedulerConfig(
                speculative_method=methods[0],
                speculative_model=a.draft_model,
                num_speculative_tokens=a.num_speculative_tokens,
                speculative_policy=a.policy,
            ),
        )
    )
    draft = engine.scheduler.drafter if a.draft_model else None
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(engine.model_dir)
    timed = ["none", *(["none'"] if a.control else []), *methods]
    policies = {m: SpecPolicy(a.policy) for m in timed}  # each method's own fit
    collector.settle()  # as a served worker once ready (WorkerShell.start)
    print(
        f"cpu: {cpu_model_name()}; {','.join(timed)}; policy {a.policy}; k {a.num_speculative_tokens}"
    )
    summary = []
    for workload in a.workload.split(","):
        for n in map(int, a.streams.split(",")):
            batch = prompts(tok, workload, n)
            for m in timed:  # warm up: the prompts into the prefix cache, each policy's fit
                engine.scheduler.policy = policies[m]
                run(engine, batch, 8, m, draft)
            cpu: dict[str, list[float]] = {m: [] for m in timed}
            wall: dict[str, list[float]] = {m: [] for m in cpu}
            outs: dict[str, list] = {}
            off = {m: p.num_switched_off for m, p in policies.items()}
            for r in range(a.rounds):  # each method in each place in turn
                for method in timed[r % len(timed) :] + timed[: r % len(timed)]:
                    c = engine.counters
                    before = (c.draft_tokens, c.accepted_tokens, c.num_steps, c.verify_steps)
                    p0, s0 = c.prompt_tokens, c.busy_time["schedule"]
                    engine.scheduler.policy = policies[method]
                    out, tps, cps = run(engine, batch, a.max_tokens, method, draft)
                    host = c.busy_time["schedule"] - s0
                    d, acc, steps, verifies = (
                        x - y
                        for x, y in zip(
                            (c.draft_tokens, c.accepted_tokens, c.num_steps, c.verify_steps), before
                        )
                    )
                    wall[method].append(tps)
                    cpu[method].append(cps)
                    outs.setdefault(method, out)
                    print(
                        f"{workload} x{n} round {r} {method:6}: {tps:.1f} tok/s, "
                        f"{cps:.1f} tok per CPU s, drafted {d}, accepted {acc}; steps {steps}, "
                        f"verify {verifies}, prefilled {c.prompt_tokens - p0}; scheduling "
                        f"{1e3 * host:.0f} ms",
                        flush=True,
                    )
            med = {m: (statistics.median(cpu[m]), statistics.median(wall[m])) for m in cpu}
            spread = f"{min(cpu['none']):.0f}-{max(cpu['none']):.0f}"
            for m in timed[1:]:
                same = outs[m] == outs["none"]
                summary.append(
                    f"{workload} x{n} {m}: {med[m][0] / med['none'][0]:.2f}x (tok per CPU s), "
                    f"{med[m][1] / med['none'][1]:.2f}x wall; none {med['none'][1]:.1f} tok/s, "
                    f"{spread} tok per CPU s; switched-off steps "
                    f"{policies[m].num_switched_off - off[m]}; equal {same}"
                )
                if not same:  # a float GEMM may round rows by the call's row count
                    print(f"{workload} x{n}: {m} output differs from plain greedy", flush=True)
            print("\n".join(summary[-len(timed) + 1 :]), flush=True)
    print("\n".join(summary))


if __name__ == "__main__":
    main()
