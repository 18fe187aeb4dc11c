"""Prompt logprobs (SamplingParams.prompt_logprobs, for echo + logprobs): every prompt
position's logprob equals transformers' log-softmax within 1e-3 (float32), whatever the
chunking, the prefix cache (skipped for such a request) or the batch; the top-k agree."""

from __future__ import annotations

import random

import pytest
import torch

from common.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from common.sampling_params import SamplingParams
from scheduler_worker.engine import LLMEngine

pytestmark = pytest.mark.timeout(300)
TOL = 1e-3


def hf_prompt_logprobs(model_dir, prompt: list[int]) -> torch.Tensor:
    """transformers' log-softmax over the vocabulary at every prompt position [len-1, V]:
    row p scores token p + 1."""
    import transformers

    from common.model_files.model_source import hf_reference_dir

    model = transformers.AutoModelForCausalLM.from_pretrained(
        hf_reference_dir(model_dir), dtype=torch.float32
    )
    with torch.no_grad():
        logits = model.eval()(torch.tensor([prompt])).logits[0].float()
    return logits[:-1].log_softmax(dim=-1)


def run(engine: LLMEngine, prompts: list[list[int]], params: SamplingParams) -> dict:
    """rid -> (prompt logprobs of its first output, all its outputs' tokens)."""
    for i, p in enumerate(prompts):
        engine.add_request(f"p{i}", p, params)
    got: dict[str, list] = {}
    while engine.has_unfinished():
        for out in engine.step():
            if out.prompt_logprobs is not None:
                assert out.request_id not in got, "prompt logprobs sent twice"
                got[out.request_id] = out.prompt_logprobs
    engine.block_manager.check_integrity()
    return got


def check(entries: list, prompt: list[int], ref: torch.Tensor, k: int) -> None:
    assert len(entries) == len(prompt)
    assert entries[0] == [prompt[0], None, []]  # the first token has no logprob
    for p in range(1, len(prompt)):
        token, lp, top = entries[p]
        assert token == prompt[p]
        assert lp == pytest.approx(ref[p - 1, prompt[p]].item(), abs=TOL)
        assert len(top) == k
        want = ref[p - 1].topk(k)
        assert [v for _, v in top] == pytest.approx(want.values.tolist(), abs=TOL)
        # the ids: each one's reference logprob is its value (ties may swap ids)
        assert [ref[p - 1, t].item() for t, _ in top] == pytest.approx([v for _, v in top], abs=TOL)


@pytest.mark.parametrize("kind", ["llama3", "qwen2", "gpt2"])
def test_tiny_models_chunked_cached_and_batched(tiny_model_dirs, kind):
    model_dir = tiny_model_dirs[kind]
    rng = random.Random(7)
    shared = [rng.randrange(3, 500) for _ in range(20)]
    prompts = [shared + [rng.randrange(3, 500) for _ in range(n)] for n in (1, 9, 30)]
    engine = LLMEngine(
        EngineConfig(
            model=ModelConfig(model=str(model_dir), dtype="float32"),
            cache=CacheConfig(block_size=4, num_blocks=256),
            # 16-token chunks: each prompt is prefilled over several steps
            scheduler=SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=16),
        ),
        model_dir,
    )
    # the shared prefix is in the cache first: prompt logprobs must not use it
    engine.generate([shared + [5, 6]], SamplingParams(max_tokens=2, temperature=0))
    params = SamplingParams(max_tokens=3, temperature=0, prompt_logprobs=2, ignore_eos=True)
    before = engine.counters.prompt_tokens
    got = run(engine, prompts, params)
    assert engine.counters.prompt_tokens - before == sum(len(p) for p in prompts)  # no cache
    for i, p in enumerate(prompts):
        check(got[f"p{i}"], p, hf_prompt_logprobs(model_dir, p), 2)
    # a one-token prompt: only its null entry; no prompt_logprobs asked: none sent
    assert run(engine, [[9]], params) == {"p0": [[9, None, []]]}
    assert run(engine, [shared], SamplingParams(max_tokens=1)) == {}


def test_default_model(default_model_dir):
    """The real model, dequantized float32 weights (as transformers loads them)."""
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(default_model_dir)
    prompt = tok("The quick brown fox jumps over the lazy dog. Paris is the capital of")[
        "input_ids"
    ]
    engine = LLMEngine(
        EngineConfig(
            model=ModelConfig(model="smollm2", dtype="float32", quantization="none"),
            # float32 K/V as transformers keeps them: chunks of 8 read the earlier ones
            # from the cache, and a float16 cache moves logprobs by ~2e-3
            cache=CacheConfig(num_blocks=64, kv_cache_dtype="float32"),
            scheduler=SchedulerConfig(max_num_batched_tokens=8),
        ),
        default_model_dir,
    )
    got = run(engine, [prompt], SamplingParams(max_tokens=1, prompt_logprobs=5))
    check(got["p0"], prompt, hf_prompt_logprobs(default_model_dir, prompt), 5)
