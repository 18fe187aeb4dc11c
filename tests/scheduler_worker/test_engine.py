"""Engine behaviour: continuous batching, prefix caching, chunked prefill, preemption,
aborts, seeds. Greedy outputs must not depend on how requests were batched."""

from __future__ import annotations

import random

import pytest

from common.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from common.limits import RequestRejectedError
from common.sampling_params import SamplingParams
from scheduler_worker.engine import LLMEngine
from tests.conftest import hf_greedy

GREEDY = SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True)


def _prompts(n: int, seed: int = 0, vocab: int = 512) -> list[list[int]]:
    rng = random.Random(seed)
    shared = [rng.randrange(3, vocab) for _ in range(11)]  # common prefix: prefix-cache hits
    return [
        shared[: rng.randrange(0, 12)]
        + [rng.randrange(3, vocab) for _ in range(rng.randrange(1, 30))]
        for _ in range(n)
    ]


def make_engine(model_dir, num_blocks=512, block_size=4, prefix=True, **sched) -> LLMEngine:
    cfg = EngineConfig(
        model=ModelConfig(model=str(model_dir), dtype="float32"),
        cache=CacheConfig(
            block_size=block_size, num_blocks=num_blocks, enable_prefix_caching=prefix
        ),
        scheduler=SchedulerConfig(**{"max_num_seqs": 8, "max_num_batched_tokens": 64, **sched}),
    )
    return LLMEngine(cfg, model_dir)


def run_staggered(engine: LLMEngine, prompts, params, every: int = 2) -> list[list[int]]:
    """Add one request every `every` steps while the others decode."""
    outs: dict[str, list[int]] = {}
    pending = list(enumerate(prompts))
    step = 0
    while pending or engine.has_unfinished():
        if pending and step % every == 0:
            i, p = pending.pop(0)
            engine.add_request(f"r{i}", p, params)
            outs[f"r{i}"] = []
        for out in engine.step():
            outs[out.request_id].extend(out.new_token_ids)
        step += 1
    engine.block_manager.check_integrity()
    return [outs[f"r{i}"] for i in range(len(prompts))]


@pytest.fixture(scope="module")
def qwen2(tiny_model_dirs):
    return tiny_model_dirs["qwen2"]


@pytest.fixture(scope="module")
def expected(qwen2):
    return hf_greedy(qwen2, _prompts(12), GREEDY.max_tokens)


@pytest.mark.parametrize(
    "setup",
    [
        dict(),  # batches of up to 8, 64-token budget: chunked prefill of long prompts
        dict(max_num_seqs=1),  # one at a time
        dict(max_num_seqs=64, max_num_batched_tokens=4096),  # everything in one batch
        dict(prefix=False),
        dict(max_decode_batch=3),  # round-robin: more running than fit a decode batch
        dict(num_blocks=24, max_num_seqs=12),  # tiny pool: preemption by recompute
        dict(block_size=1, max_num_batched_tokens=7),
    ],
    ids=["default", "serial", "one-batch", "no-prefix-cache", "round-robin", "preemption", "bs1"],
)
def test_greedy_independent_of_batching(qwen2, expected, setup):
    engine = make_engine(qwen2, **setup)
    prompts = _prompts(12)
    assert engine.generate(prompts, GREEDY) == expected
    engine.block_manager.check_integrity()
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


def test_preemption_happens_and_keeps_outputs(qwen2, expected):
    engine = make_engine(qwen2, num_blocks=24, max_num_seqs=12)
    assert engine.generate(_prompts(12), GREEDY) == expected
    assert engine.scheduler.num_preemptions > 0, "a 24-block pool must force preemption"


def test_arrival_order_and_prefix_cache_hits(qwen2, expected):
    engine = make_engine(qwen2)
    assert run_staggered(engine, _prompts(12), GREEDY, every=3) == expected
    bm = engine.block_manager
    assert bm.prefix_cache_hits > 0 and bm.prefix_cache_queries > bm.prefix_cache_hits


def test_llama_batched_equals_transformers(tiny_model_dirs):
    model_dir = tiny_model_dirs["llama3"]
    prompts = _prompts(6, seed=3)
    engine = make_engine(model_dir, max_num_batched_tokens=16)
    assert run_staggered(engine, prompts, GREEDY) == hf_greedy(
        model_dir, prompts, GREEDY.max_tokens
    )


def test_long_prompt_is_chunked_while_others_decode(qwen2):
    # the plain path: drafts would take the prompt's budget and end the short rows early
    engine = make_engine(
        qwen2, max_num_batched_tokens=16, max_num_seqs=8, speculative_method="none"
    )
    params = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    for i in range(3):
        engine.add_request(f"short{i}", [10 + i, 11, 12], params)
    for _ in range(3):
        engine.step()
    engine.add_request("long", list(range(3, 203)), SamplingParams(max_tokens=4, temperature=0.0))
    chunks = 0
    while engine.requests["long"].num_output_tokens == 0:
        outs = {o.request_id: o for o in engine.step()}
        for i in range(3):  # every running stream gets its token in every step
            assert len(outs[f"short{i}"].new_token_ids) == 1
        chunks += 1
        assert engine.last_step.num_prefill_tokens <= 16 - 3
    assert chunks >= 200 // 13
    while engine.has_unfinished():
        engine.step()
    engine.block_manager.check_integrity()


def test_aborts_in_every_state_free_everything(qwen2):
    engine = make_engine(qwen2, max_num_batched_tokens=8, max_num_seqs=2)
    params = SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True)
    engine.add_request("running", [5, 6, 7], params)
    engine.add_request("prefilling", list(range(3, 60)), params)
    engine.add_request("waiting", [8, 9], params)
    engine.add_request("done", [4], SamplingParams(max_tokens=1, temperature=0.0))
    engine.step()
    engine.step()
    states = {
        rid: engine.requests[rid].status.value for rid in ("running", "prefilling", "waiting")
    }
    assert states == {"running": "running", "prefilling": "running", "waiting": "waiting"}
    assert engine.requests["prefilling"].in_prefill_queue
    assert engine.abort("running") and engine.abort("prefilling") and engine.abort("waiting")
    assert not engine.abort("running")  # idempotent
    assert not engine.abort("never-seen")
    outs = engine.step()
    aborted = {o.request_id for o in outs if o.finish_reason == "abort"}
    assert aborted == {"running", "prefilling", "waiting"}
    while engine.has_unfinished():
        engine.step()
    assert not engine.abort("done")
    bm = engine.block_manager
    bm.check_integrity()
    assert (
        bm.num_free_blocks == bm.num_blocks and engine.num_running == 0 and engine.num_waiting == 0
    )


def test_seed_reproducible_alone_and_in_mixed_batch(qwen2):
    seeded = SamplingParams(max_tokens=16, temperature=1.0, top_p=0.9, seed=1234, ignore_eos=True)
    alone = make_engine(qwen2).generate([[5, 6, 7]], seeded)[0]
    engine = make_engine(qwen2)
    others = [
        SamplingParams(max_tokens=12, temperature=0.8, ignore_eos=True),
        SamplingParams(max_tokens=16, temperature=1.0, seed=99, ignore_eos=True),
        SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True),
    ]
    mixed = engine.generate(
        [[9, 9], [5, 6, 7], [1, 2, 3, 4], [5, 6, 7]], [others[0], seeded, others[1], others[2]]
    )
    assert mixed[1] == alone
    assert (
        make_engine(qwen2).generate(
            [[5, 6, 7]],
            SamplingParams(max_tokens=16, temperature=1.0, top_p=0.9, seed=4321, ignore_eos=True),
        )[0]
        != alone
    )


def test_stop_conditions(qwen2, expected):
    engine = make_engine(qwen2)
    prompt = _prompts(12)[0]
    ref = expected[0]
    stop_tok = ref[5]
    first = ref.index(stop_tok)
    out = engine.generate(
        [prompt], SamplingParams(max_tokens=20, temperature=0.0, stop_token_ids=[stop_tok])
    )[0]
    assert out == ref[: first + 1]
    engine.add_request(
        "s", prompt, SamplingParams(max_tokens=20, temperature=0.0, stop_token_ids=[stop_tok])
    )
    last = [o for _ in range(first + 2) for o in engine.step()][-1]
    assert (last.finish_reason, last.stop_token_id) == ("stop", stop_tok)  # vLLM's stop_reason
    out = engine.generate(
        [prompt],
        SamplingParams(
            max_tokens=20, temperature=0.0, min_tokens=first + 2, stop_token_ids=[stop_tok]
        ),
    )[0]
    # the stop id is masked for the first min_tokens positions, so it cannot end the request early
    assert len(out) >= first + 2 and out[:first] == ref[:first]
    assert stop_tok not in out[: first + 2]


def test_rejects_requests_it_can_never_serve(qwen2):
    engine = make_engine(qwen2, num_blocks=8)
    with pytest.raises(RequestRejectedError, match="context length"):
        engine.add_request("a", [5] * 500, SamplingParams(max_tokens=20))
    with pytest.raises(RequestRejectedError, match="KV blocks"):
        engine.add_request("b", [5] * 30, SamplingParams(max_tokens=20))
    with pytest.raises(ValueError, match="vocabulary"):
        engine.add_request("c", [5, 100000], SamplingParams(max_tokens=2))
    with pytest.raises(ValueError, match="temperature"):
        engine.add_request("d", [5], SamplingParams(temperature=-1))
    assert engine.num_unfinished == 0


def test_offline_engine_takes_its_thread_count(tiny_llama_dir):
    """ModelConfig.num_threads sets torch's threads in the offline engine too (the worker
    is not the only caller: benchmarks build engines in process)."""
    import torch

    before = torch.get_num_threads()
    want = 1 if before != 1 else 2
    try:
        LLMEngine(
            EngineConfig(model=ModelConfig(model=str(tiny_llama_dir), num_threads=want)),
            tiny_llama_dir,
        )
        assert torch.get_num_threads() == want
    finally:
        torch.set_num_threads(before)
