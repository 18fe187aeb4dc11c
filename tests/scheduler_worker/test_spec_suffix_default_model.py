"""Suffix drafts on the real default model (the embedded SmolLM2 GGUF): greedy output with
suffix drafts equals greedy output without, token for token, for every request of the
bench's `agent` and `extract` workloads run one after another (so later requests draft
from earlier ones' outputs), on the default quantized path and in float32. The CPU's
verify runs as decode rows of the one-call decode step (spec/verify_rows.py), which the
quantized path computes bit for bit as plain decode steps. Float32's linears are torch's
GEMM, whose rounding depends on the step's row count (test_spec_verify_rows.py), so there
the equality is measured on these prompts, not given by construction (before the verify
went through the decode rows, agent request 6 differed at its 5th output token); float32,
~5x slower a step, runs the agent workload's first FLOAT32_AGENT_REQUESTS requests only,
FLOAT32_MAX_TOKENS tokens each."""

from __future__ import annotations

import pytest

from benchmarks.bench_spec_methods import workload_prompts
from common.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from common.sampling_params import SamplingParams
from scheduler_worker.engine import LLMEngine
from scheduler_worker.spec.suffix import SuffixDrafter

FLOAT32_AGENT_REQUESTS = 8  # past request 6, where float32 once differed
FLOAT32_MAX_TOKENS = 24  # it differed at that request's 5th token


@pytest.mark.timeout(1800)
@pytest.mark.parametrize("quantization", ["auto", "none"], ids=["gguf-blocks", "float32"])
def test_default_model_greedy_equal_with_suffix(default_model_dir, quantization):
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
    for workload in ("agent", "extract") if quantization == "auto" else ("agent",):
        prompts = workload_prompts(default_model_dir, workload)
        if quantization == "none":
            prompts = prompts[:FLOAT32_AGENT_REQUESTS]
        outs: dict[bool, list[list[int]]] = {False: [], True: []}
        for spec in (False, True):  # one engine: the request's flag switches the drafts
            engine.scheduler.drafter = SuffixDrafter()  # the store starts empty each time
            before = engine.counters.accepted_tokens
            n = 64 if quantization == "auto" else FLOAT32_MAX_TOKENS
            params = SamplingParams(max_tokens=n, temperature=0.0, speculative=spec)
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
