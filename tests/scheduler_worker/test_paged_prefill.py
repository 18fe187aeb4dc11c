"""Short prefill chunks attended by the C++ paged kernel, a row per token
(attention.PAGED_PREFILL_MAX_CONTEXT), give the logits of torch's SDPA path: fresh prompts,
tails over a cached prefix, a step mixing them with decodes and with a prompt over the
threshold (which stays on SDPA), and sliding windows cut mid-block."""

from __future__ import annotations

import pytest
import torch

import scheduler_worker.backends.cpu as cpu_backend
from common.config import CacheConfig, EngineConfig, ModelConfig
from scheduler_worker.model_runner import ModelRunner, SeqInput
from tests.conftest import kernels_built
from tests.scheduler_worker.test_sliding_window import WINDOW, mistral_window_dir  # noqa: F401

pytestmark = pytest.mark.skipif(not kernels_built(), reason="the C++ kernels are not built here")

THRESHOLD = 16  # context tokens; the scenario's long prompt (30) is over it


def _runner(model_dir) -> ModelRunner:
    cfg = EngineConfig(
        model=ModelConfig(model=str(model_dir), dtype="float32"),
        cache=CacheConfig(block_size=4, num_blocks=128),
    )
    runner = ModelRunner(cfg, model_dir)
    assert runner.decode_kernel == "paged"
    return runner


def _scenario(runner: ModelRunner) -> list[torch.Tensor]:
    """The logits of every step of a fixed schedule."""
    tables = [list(range(i * 10, (i + 1) * 10)) for i in range(5)]
    prefix = list(range(30, 42))  # 12 tokens, then a tail of 4: context 16
    out = [
        runner.execute([SeqInput(prefix, 0, tables[0], sample=False)]),
        runner.execute([SeqInput([5, 6, 7, 8, 9], 0, tables[1])]),  # the decoding sequence
    ]
    step = [
        SeqInput([11], 5, tables[1]),  # a decode
        SeqInput(list(range(60, 70)), 0, tables[2]),  # a fresh short prompt
        SeqInput([42, 43, 44, 45], 12, tables[0]),  # a short tail over the cached prefix
        SeqInput(list(range(100, 130)), 0, tables[3]),  # over the threshold: SDPA
    ]
    out.append(runner.execute(step))
    out.append(runner.execute(step[:3]))  # every prefill short: the kernel takes all rows
    return out


@pytest.mark.parametrize("kind", ["llama3", "qwen2", "window"])
def test_short_prefills_on_the_kernel_equal_sdpa(kind, tiny_model_dirs, request, monkeypatch):
    model_dir = (
        request.getfixturevalue("mistral_window_dir") if kind == "window" else tiny_model_dirs[kind]
    )
    runner = _runner(model_dir)
    monkeypatch.setattr(cpu_backend, "PAGED_PREFILL_MAX_CONTEXT", 0)
    sdpa = _scenario(runner)
    monkeypatch.setattr(cpu_backend, "PAGED_PREFILL_MAX_CONTEXT", THRESHOLD)
    kernel = _scenario(runner)
    for a, b in zip(kernel, sdpa):
        assert a.shape == b.shape
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


def test_which_rows_the_kernel_takes(tiny_model_dirs, monkeypatch):
    monkeypatch.setattr(cpu_backend, "PAGED_PREFILL_MAX_CONTEXT", THRESHOLD)
    runner = _runner(tiny_model_dirs["llama3"])
    seqs = [
        SeqInput(list(range(60, 70)), 0, list(range(20, 23))),  # 10 tokens, short
        SeqInput([11], 5, [10, 11]),  # a decode: first in the step's order
        SeqInput(list(range(100, 130)), 0, list(range(30, 38))),  # 30 tokens: SDPA
        SeqInput([42, 43, 44, 45], 12, [0, 1, 2, 3]),  # a tail: context 16, short
    ]
    _, pos, meta = runner.prepare(seqs)
    assert [p.paged for p in meta.prefills] == [True, False, True]
    assert meta.row_index is not None and meta.row_block_tables is not None
    assert meta.row_context_lens is not None
    # the decode (row 0), the short prompt (rows 1-10), the tail (rows 41-44)
    expected = [0, *range(1, 11), *range(41, 45)]
    assert meta.row_index.tolist() == expected
    assert meta.row_context_lens.tolist() == [6, *range(1, 11), 13, 14, 15, 16]
    assert meta.row_block_tables[0, :2].tolist() == [10, 11]
    assert meta.row_block_tables[1, :3].tolist() == [20, 21, 22]
    assert meta.row_block_tables[-1, :4].tolist() == [0, 1, 2, 3]
    # every prefill short: the kernel takes every row, in place
    _, pos, meta = runner.prepare([seqs[0], seqs[1], seqs[3]])
    assert meta.row_index is None and meta.row_context_lens is not None
    assert torch.equal(meta.row_context_lens, pos + 1)
    # none short: no rows
    _, _, meta = runner.prepare([seqs[2]])
    assert meta.row_block_tables is None and not meta.prefills[0].paged


def test_a_prompt_gives_the_same_logits_however_it_was_chunked_or_cached(
    default_model_dir, each_cpu_kind
):
    """On the kernels' path every prompt position is attended by the paged kernel, a row of
    its own, as a decode step attends it (attention.PAGED_PREFILL_MAX_CONTEXT): the default
    model's first tokens' logprobs are then the same bit for bit computed fresh in one
    chunk, in chunks of any size (across the old threshold of 384, a last one of a single
    token), or over the prefix the first run cached (a tail of one token: 705 = 44 blocks
    + 1). And a decoded token's are those of the same position computed as a prompt (a
    preempted request's recompute, a conversation's next turn computed afresh). With SDPA
    past 384 tokens of context, as before, most of these differed."""
    import dataclasses
    import random

    from common.config import SchedulerConfig
    from common.sampling_params import SamplingParams
    from scheduler_worker.engine import LLMEngine

    cfg = EngineConfig(
        model=ModelConfig(model=str(default_model_dir)),
        scheduler=SchedulerConfig(speculative_method="none"),
    )
    engine = LLMEngine(cfg, default_model_dir)
    assert engine.runner.decode_kernel == "paged"

    def first_logprobs(rid: str, ids: list[int], budget: int) -> list:
        sched = engine.scheduler
        sched.config = dataclasses.replace(sched.config, max_num_batched_tokens=budget)
        engine.add_request(rid, ids, SamplingParams(max_tokens=3, temperature=0.0, logprobs=5))
        out = []  # (tokens, logprobs) of each output
        while engine.has_unfinished():
            out += [(o.new_token_ids, o.logprobs) for o in engine.step() if o.request_id == rid]
        return out

    rng = random.Random(0)
    ids = [rng.randrange(100, 40000) for _ in range(705)]
    fresh = first_logprobs("fresh", ids, 2048)  # one chunk; its blocks now cached
    assert len(fresh) == 3
    assert first_logprobs("cached", ids, 512) == fresh  # 704 cached, a tail of one
    engine.scheduler.blocks.enable_prefix_caching = False
    for budget in (512, 352, 100, 37):  # 352: 352 + 352 + a chunk of one
        assert first_logprobs(f"chunks of {budget}", ids, budget) == fresh, budget
    decoded = [t for tokens, _ in fresh for t in tokens]
    again = first_logprobs("as a prompt", ids + decoded[:2], 512)  # the third decoded
    assert again[0] == fresh[2]
