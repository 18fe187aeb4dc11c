"""A draft model's batched proposals over persistent draft sequences (spec/draft_model.py),
on the tiny random Llama drafted for by a perturbed copy of itself (so that drafts are
accepted often and refused often: both roll the draft sequences back): greedy output with
drafts equals output without and transformers', for concurrent rows that finish mid-draft
(max_tokens, stop tokens), under preemption; seeded sampled rows reproduce; a step's rows
draft in k forwards together; every draft block goes back to the pool."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from common.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from common.sampling_params import SamplingParams
from scheduler_worker.engine import LLMEngine
from scheduler_worker.spec.draft_model import DraftModelDrafter
from tests.conftest import copy_tokenizer_files, hf_greedy

K = 3
PROMPTS = [
    [1, 591, 3035, 314, 260, 1345, 30],
    [1, 1318, 314, 253, 5099, 28, 2059, 29],
    [1, 57, 1042, 2823, 288, 5016, 30, 2985, 1200, 3240, 46],
    [1, 767, 1044, 30],
    [1, 9638, 3700, 28, 1234, 42],
    [1, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13],
]


@pytest.fixture(scope="module")
def perturbed_llama_dir(tiny_llama_dir, tmp_path_factory) -> Path:
    """The tiny Llama with noise on every weight: its greedy choice agrees with the
    original's at most positions, not all."""
    import transformers

    out = tmp_path_factory.mktemp("perturbed_llama")
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_llama_dir)
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.1 * p.std())
    model.save_pretrained(out)
    copy_tokenizer_files(tiny_llama_dir, out)
    return out


def _engine(target: Path, draft: Path, num_blocks: int, seqs: int = 4) -> LLMEngine:
    return LLMEngine(
        EngineConfig(
            model=ModelConfig(model=str(target), dtype="float32"),
            cache=CacheConfig(num_blocks=num_blocks, block_size=16),
            scheduler=SchedulerConfig(
                max_num_seqs=seqs,
                speculative_model=str(draft),
                num_speculative_tokens=K,
                speculative_policy="always",
            ),
        ),
        target,
    )


def _drafter(engine: LLMEngine) -> DraftModelDrafter:
    drafter = engine.scheduler.drafter
    assert isinstance(drafter, DraftModelDrafter)
    return drafter


def _assert_all_freed(engine: LLMEngine) -> None:
    drafter = _drafter(engine)
    assert not drafter.kv.seqs
    drafter.kv.check()
    pool = drafter.engine.block_manager
    assert pool.num_free_blocks == pool.num_blocks
    engine.block_manager.check_integrity()


@pytest.fixture(scope="module")
def engine(tiny_llama_dir, perturbed_llama_dir) -> LLMEngine:
    return _engine(tiny_llama_dir, perturbed_llama_dir, num_blocks=256)


def _params(max_tokens: list[int], **kw) -> list[SamplingParams]:
    return [
        SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True, **kw) for n in max_tokens
    ]


def test_concurrent_rows_equal_without_drafts_and_transformers(engine, tiny_llama_dir):
    drafter = _drafter(engine)
    lens = [40, 23, 31, 17, 40, 29]  # rows end at every offset into a draft run
    plain = engine.generate(PROMPTS, [replace_spec(p) for p in _params(lens)])
    steps0, forwards0 = engine.counters.verify_steps, drafter.num_forwards
    d0, a0, asked0 = (
        engine.counters.draft_tokens,
        engine.counters.accepted_tokens,
        drafter.num_proposals,
    )
    drafted = engine.generate(PROMPTS, _params(lens))
    assert drafted == plain
    assert drafted == [h[:n] for h, n in zip(hf_greedy(tiny_llama_dir, PROMPTS, 40), lens)]
    n_draft, n_acc = engine.counters.draft_tokens - d0, engine.counters.accepted_tokens - a0
    assert n_draft > 60 and n_draft // 5 < n_acc < n_draft * 9 // 10, (n_draft, n_acc)
    # batched: k forwards a drafting step whatever its rows (4 running at once)
    steps = engine.counters.verify_steps - steps0
    assert drafter.num_forwards - forwards0 <= K * steps
    assert drafter.num_proposals - asked0 > 2 * steps
    # persistent: each row's tokens computed once, plus its last token again a proposal
    total = sum(map(len, PROMPTS)) + sum(lens)
    assert drafter.num_computed <= 2 * total + drafter.num_proposals
    _assert_all_freed(engine)


def replace_spec(p: SamplingParams) -> SamplingParams:
    from dataclasses import replace

    return replace(p, speculative=False)


def test_stop_tokens_mid_draft(engine):
    # each row's own tokens at its 5th and 12th outputs (known from a plain run) stop it
    plain = engine.generate(PROMPTS, [replace_spec(p) for p in _params([30] * 6)])
    stops = [[out[4], out[11]] for out in plain]
    params = [SamplingParams(max_tokens=30, temperature=0.0, stop_token_ids=s) for s in stops]
    without = engine.generate(PROMPTS, [replace_spec(p) for p in params])
    drafted = engine.generate(PROMPTS, params)
    assert drafted == without
    assert all(len(out) <= 12 and out[-1] in s for out, s in zip(drafted, stops))
    _assert_all_freed(engine)


def test_seeded_sampled_rows_reproduce(engine):
    params = [
        SamplingParams(max_tokens=24, temperature=0.9, top_p=0.95, seed=s, ignore_eos=True)
        for s in range(len(PROMPTS))
    ]
    first = engine.generate(PROMPTS, params)
    assert engine.generate(PROMPTS, params) == first
    assert engine.generate(PROMPTS, [replace_spec(p) for p in params]) == first
    _assert_all_freed(engine)


def test_preemption_drops_and_restarts_draft_sequences(tiny_llama_dir, perturbed_llama_dir):
    # 10 blocks of 16 tokens for 4 rows of ~8 + 60 tokens (5 blocks each): rows preempt
    engine = _engine(tiny_llama_dir, perturbed_llama_dir, num_blocks=10)
    lens = [60, 55, 60, 50, 45, 60]
    plain = engine.generate(PROMPTS, [replace_spec(p) for p in _params(lens)])
    p0 = engine.scheduler.num_preemptions
    assert p0 > 0
    drafted = engine.generate(PROMPTS, _params(lens))
    assert drafted == plain
    assert engine.scheduler.num_preemptions > p0
    assert engine.counters.accepted_tokens > 0
    _assert_all_freed(engine)


def test_many_requests_leave_the_draft_pool_as_it_started(engine):
    pool = _drafter(engine).engine.block_manager
    start = pool.num_free_blocks
    for round_ in range(4):
        prompts = [[1, 100 + round_ * 7 + i, 200 + i, 300] for i in range(10)]
        engine.generate(prompts, _params([12 + i % 5 for i in range(10)]))
        assert pool.num_free_blocks == start
    for i in range(5):  # aborted mid-draft
        engine.add_request(f"abort-{i}", PROMPTS[i], _params([40])[0])
    for _ in range(6):
        engine.step()
    assert _drafter(engine).kv.seqs
    for i in range(5):
        engine.abort(f"abort-{i}")
    while engine.has_unfinished():
        engine.step()
    _assert_all_freed(engine)


def test_a_long_prompt_catches_up_in_chunks(tiny_llama_dir, perturbed_llama_dir):
    # 32 tokens a step, the draft's catch-up too: a 100-token prompt takes its draft
    # sequence four proposals to catch up (the first three chunks draft nothing)
    engine = LLMEngine(
        EngineConfig(
            model=ModelConfig(model=str(tiny_llama_dir), dtype="float32"),
            cache=CacheConfig(num_blocks=64, block_size=16),
            scheduler=SchedulerConfig(
                max_num_seqs=2,
                max_num_batched_tokens=32,
                speculative_model=str(perturbed_llama_dir),
                num_speculative_tokens=K,
                speculative_policy="always",
            ),
        ),
        tiny_llama_dir,
    )
    prompts = [[1, *range(1000, 1099)], PROMPTS[0]]
    for batch in (prompts[:1], prompts):  # alone, its first steps forward no sampled row
        lens = [30] * len(batch)
        plain = engine.generate(batch, [replace_spec(p) for p in _params(lens)])
        assert engine.generate(batch, _params(lens)) == plain
    drafter = _drafter(engine)
    assert engine.counters.accepted_tokens > 0
    assert (
        drafter.num_computed
        <= 2 * (len(prompts[0]) + 30) + sum(map(len, prompts)) + 30 + drafter.num_proposals
    )
    _assert_all_freed(engine)
