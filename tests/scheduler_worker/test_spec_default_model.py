"""Speculative decoding on the real default model (the embedded SmolLM2 GGUF): greedy
output with ngram drafts equals greedy output without, token for token, on the default
quantized path and in float32, with prompts that repeat text (drafts are accepted)."""

from __future__ import annotations

import pytest

from benchmarks.bench_spec import PASSAGE
from common.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from common.sampling_params import SamplingParams
from scheduler_worker.engine import LLMEngine

ASKS = [
    f"Repeat the following passage word for word.\n\n{PASSAGE}",
    "Write the word 'apple, banana, cherry' ten times, one per line.",
    "Count from 1 to 40, separated by commas.",
]


def _prompts(model_dir) -> list[list[int]]:
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(model_dir)
    out = []
    for ask in ASKS:
        messages = [{"role": "user", "content": ask}]
        ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        out.append(list(ids["input_ids"] if hasattr(ids, "keys") else ids))
    return out


@pytest.mark.timeout(900)
@pytest.mark.parametrize("quantization", ["auto", "none"], ids=["gguf-blocks", "float32"])
def test_default_model_greedy_equal_with_ngram(default_model_dir, quantization):
    engine = LLMEngine(
        EngineConfig(
            model=ModelConfig(model="smollm2", dtype="float32", quantization=quantization),
            cache=CacheConfig(num_blocks=128),
            scheduler=SchedulerConfig(
                max_num_seqs=4, speculative_method="ngram", num_speculative_tokens=5
            ),
        ),
        default_model_dir,
    )
    prompts = _prompts(default_model_dir)
    outs = {}
    for spec in (False, True):  # one engine: the request's flag switches the drafts
        params = SamplingParams(max_tokens=64, temperature=0.0, speculative=spec)
        outs[spec] = engine.generate(prompts, params)
    assert engine.counters.accepted_tokens > 20  # the repeats were drafted and accepted
    for i, (got, want) in enumerate(zip(outs[True], outs[False], strict=True)):
        assert got == want, f"prompt {i}: first difference at token " + str(
            next((j for j, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
        )
    engine.block_manager.check_integrity()
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
