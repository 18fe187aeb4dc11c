"""A prompt's prefill with its attention on the C++ paged kernel (every chunk, as served
since the twenty-eighth session) against torch's SDPA past a context limit (384, as
before): one engine, the two alternated prompt by prompt, the fastest of each printed.

    .venv/bin/python benchmarks/bench_prefill_attention.py --lengths 512 1024 2048 4096
        [--budget 512] [--kernels auto|avx2|...] [--dtype auto|bfloat16] [--rounds 3]

`--budget` is max_num_batched_tokens: the CPU's default 512 chunks a long prompt as a
server does; a chunk after the first attends its cached prefix (SDPA: gathered and cast
from the float16 cache, under an explicit mask). Random prompts, no prefix cache, one new
token, the machine's threads. docs/benchmarks.md, "One kernel for every prompt".
"""

from __future__ import annotations

import argparse
import random
import time

from common.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from common.model_files.model_source import resolve_model
from common.sampling_params import SamplingParams
from scheduler_worker import attention
from scheduler_worker.backends import cpu as cpu_backend
from scheduler_worker.engine import LLMEngine

WAYS = {"paged": None, "sdpa past 384": 384}  # attention.PAGED_PREFILL_MAX_CONTEXT


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--lengths", type=int, nargs="+", default=[512, 1024, 2048, 4096])
    ap.add_argument("--budget", type=int, default=512, help="max_num_batched_tokens")
    ap.add_argument("--kernels", default="auto")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--rounds", type=int, default=3, help="prompts of each way a length")
    args = ap.parse_args()
    path = resolve_model(args.model)
    cfg = EngineConfig(
        model=ModelConfig(model=str(path), kernels=args.kernels, dtype=args.dtype),
        cache=CacheConfig(enable_prefix_caching=False),
        scheduler=SchedulerConfig(max_num_batched_tokens=args.budget, speculative_method="none"),
    )
    engine = LLMEngine(cfg, path)
    if engine.runner.decode_kernel != "paged":
        raise SystemExit("the paged kernel does not serve this model here (kernels not built?)")
    rng, one = random.Random(0), SamplingParams(max_tokens=1, temperature=0.0)

    def prefill(n: int, limit: int | None) -> float:
        attention.PAGED_PREFILL_MAX_CONTEXT = cpu_backend.PAGED_PREFILL_MAX_CONTEXT = limit
        engine.add_request(
            f"p{time.perf_counter_ns()}", [rng.randrange(100, 40000) for _ in range(n)], one
        )
        t0 = time.perf_counter()
        while engine.has_unfinished():
            engine.step()
        return time.perf_counter() - t0

    print(f"{args.model}, kernels {args.kernels}, dtype {args.dtype}, budget {args.budget}")
    for n in args.lengths:
        prefill(n, None)  # warm
        times: dict[str, list[float]] = {way: [] for way in WAYS}
        for _ in range(args.rounds):
            for way, limit in WAYS.items():
                times[way].append(prefill(n, limit))
        paged, sdpa = (min(v) for v in times.values())
        print(
            f"{n:6d} tokens: paged {paged * 1e3:8.1f} ms, sdpa past 384 {sdpa * 1e3:8.1f} ms,"
            f" paged / sdpa {paged / sdpa:.3f}",
            flush=True,
        )
    attention.PAGED_PREFILL_MAX_CONTEXT = cpu_backend.PAGED_PREFILL_MAX_CONTEXT = None


if __name__ == "__main__":
    main()
