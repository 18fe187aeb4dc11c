"""The real default model (SmolLM2-135M-Instruct from the embedded GGUF) against
transformers loading the same converted directory: greedy, float32, token for token."""

from __future__ import annotations

import pytest

from common.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from common.sampling_params import SamplingParams
from scheduler_worker.engine import LLMEngine
from tests.conftest import hf_greedy

CHATS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [
        {"role": "system", "content": "You are a poet."},
        {"role": "user", "content": "Write two lines about the sea."},
    ],
    [
        {"role": "user", "content": "List three prime numbers."},
        {"role": "assistant", "content": "2, 3, 5."},
        {"role": "user", "content": "Three more, please, and explain why they are prime."},
    ],
]
NEW_TOKENS = 32


def chat_prompts(model_dir) -> list[list[int]]:
    """CHATS through the model's chat template, as token ids."""
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(model_dir)
    out = []
    for messages in CHATS:
        ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        out.append(list(ids["input_ids"] if hasattr(ids, "keys") else ids))
    return out


@pytest.fixture(scope="module")
def prompts(default_model_dir) -> list[list[int]]:
    return chat_prompts(default_model_dir)


@pytest.mark.timeout(300)
def test_default_model_greedy_equals_transformers(default_model_dir, prompts):
    expected = hf_greedy(default_model_dir, prompts, NEW_TOKENS)
    engine = LLMEngine(
        EngineConfig(
            model=ModelConfig(model="smollm2", dtype="float32", quantization="none"),
            cache=CacheConfig(num_blocks=64),
            scheduler=SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=256),
        ),
        default_model_dir,
    )
    params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)
    together = engine.generate(prompts, params)  # batched prefill, then batched decode
    assert len(together) == len(expected) == len(CHATS)
    for i, (got, want) in enumerate(zip(together, expected, strict=True)):
        assert len(got) == len(want) == NEW_TOKENS, (i, len(got), len(want))
        assert got == want, (
            f"chat {i}: first difference at token "
            f"{next(j for j, (a, b) in enumerate(zip(got, want)) if a != b)}"
        )
    engine.block_manager.check_integrity()
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
