"""Suffix drafts on the real default model (the embedded SmolLM2 GGUF): greedy output with
suffix drafts equals greedy output without, token for token, for every request of the
bench's `agent` and `extract` workloads run one after another (so later requests draft
from earlier ones' outputs), in float32. On the default quantized path the verify step
(the prompt path's kernels over 1 + k tokens) rounds unlike the one-token decode kernel:
agent request 2 takes another token at a near-tie at its 8th output token (issue 53,
item 6: verify through the decode kernel), so that path is not asserted equal here."""

from __future__ import annotations

import pytest

from benchmarks.bench_spec_methods import workload_prompts
from common.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from common.sampling_params import SamplingParams
from scheduler_worker.engine import LLMEngine
from scheduler_worker.spec.suffix import SuffixDrafter


@pytest.mark.timeout(1800)
@pytest.mark.xfail(
    strict=True,
    reason="known defect (issue 53): with suffix drafts agent request 6 differs at its 5th "
    "output token even in float32 (ngram's default-model tests are equal); not yet traced",
)
def test_default_model_greedy_equal_with_suffix(default_model_dir, quantization="none"):
    engine = LLMEngine(
        EngineConfig(
            model=ModelConfig(model="smollm2", dtype="float32", quantization=quantization),
            cache=CacheConfig(num_blocks=256),
            scheduler=SchedulerConfig(
                max_num_seqs=4,
                speculative_method="suffix",
                num_speculative_tokens=5,
                speculative_policy="always",
            ),
        ),
        default_model_dir,
    )
    drafter = engine.scheduler.drafter
    assert isinstance(drafter, SuffixDrafter)
    for workload in ("agent", "extract"):
        prompts = workload_prompts(default_model_dir, workload)
        outs: dict[bool, list[list[int]]] = {False: [], True: []}
        for spec in (False, True):  # one engine: the request's flag switches the drafts
            engine.scheduler.drafter = SuffixDrafter()  # the store starts empty each time
            before = engine.counters.accepted_tokens
            params = SamplingParams(max_tokens=64, temperature=0.0, speculative=spec)
            for prompt in prompts:  # one after another: the store fills as they finish
                outs[spec] += engine.generate([prompt], params)
            accepted = engine.counters.accepted_tokens - before
        assert accepted > 3 * len(prompts), workload  # drafts were made and accepted
        for i, (got, want) in enumerate(zip(outs[True], outs[False], strict=True)):
            assert got == want, f"{workload} request {i}: first difference at token " + str(
                next(
                    (j for j, (a, b) in enumerate(zip(got, want)) if a != b),
                    min(len(got), len(want)),
                )
            )
    engine.block_manager.check_integrity()
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
