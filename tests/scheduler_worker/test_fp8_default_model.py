"""FP8 numerics on the real default model (SmolLM2-135M-Instruct, its GGUF dequantized by
the loader): every linear quantized at load as --quantization fp8 does (E4M3 per output
channel, activations per token, the scaled matmul emulated in float32) against the same
model with its weights rounded to bfloat16, computed in float32, on prompt logprobs (the
next-token logprob at every position of a few prompts).

The issue asked for 0.1 at most; this model does not get there: E4M3's rounding step is 16x
bfloat16's, and bf16's own distance from float32 here is 0.02-0.04, so FP8's is 0.3-0.8 at
the worst token (docs/benchmarks.md, "FP8 weights", with the perplexities). This test holds
the measured envelope, so that a wrong scale or layout (several nats) fails it."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from common.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from common.sampling_params import SamplingParams
from scheduler_worker.engine import LLMEngine
from scheduler_worker.quant.fp8 import FP8, Fp8Linear

BOOK = Path(__file__).resolve().parents[2] / "benchmarks" / "data" / "pride_and_prejudice_ch1-6.txt"
MAX_BOUND, MEAN_BOUND = 1.2, 0.25  # measured: max 0.31-0.81, mean 0.13-0.18 a prompt


def _engine(model_dir: Path, quantization: str) -> LLMEngine:
    return LLMEngine(
        EngineConfig(
            model=ModelConfig(
                model=str(model_dir), dtype="float32", device="cpu", quantization=quantization
            ),
            cache=CacheConfig(num_blocks=96, kv_cache_dtype="float32", enable_prefix_caching=False),
            scheduler=SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=512),
        )
    )


def prompt_logprobs(engine: LLMEngine, prompts: list[list[int]]) -> list[list[float]]:
    params = SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=0, ignore_eos=True)
    got: list[list[float]] = []
    for i, p in enumerate(prompts):
        engine.add_request(f"p{i}", p, params)
        while engine.has_unfinished():
            for out in engine.step():
                if out.prompt_logprobs is not None:
                    got.append([entry[1] for entry in out.prompt_logprobs[1:]])
    return got


def prompts_of(model_dir: Path) -> list[list[int]]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    book = BOOK.read_text()
    texts = [
        "The capital of France is Paris. The capital of Italy is",
        "def fibonacci(n):\n    if n < 2:\n        return n\n    return",
        book[20000:20500],  # ~110 tokens of held-out prose
    ]
    return [tok(t)["input_ids"] for t in texts]


def test_fp8_logprobs_stay_within_the_measured_envelope_on_the_default_model(
    default_model_dir,
):
    prompts = prompts_of(default_model_dir)
    ref = _engine(default_model_dir, "none")
    with torch.no_grad():  # the bf16 checkpoint: every linear's weight rounded to bfloat16
        for m in ref.runner.model.modules():
            if isinstance(m, nn.Linear):
                m.weight.copy_(m.weight.bfloat16().float())
    want = prompt_logprobs(ref, prompts)
    del ref
    fp8 = _engine(default_model_dir, "fp8")
    linears = [m for m in fp8.runner.model.modules() if isinstance(m, Fp8Linear)]
    assert len(linears) == 30 * 4  # 30 layers' qkv, o, gate_up, down; the head stays float
    assert all(m.weight.dtype == FP8 for m in linears)
    got = prompt_logprobs(fp8, prompts)
    for g, w in zip(got, want, strict=True):
        assert len(g) == len(w) > 5
        d = [abs(a - b) for a, b in zip(g, w)]
        worst, mean = max(d), sum(d) / len(d)
        print(f"{len(d)} tokens: max |FP8 - bf16| {worst:.4f}, mean {mean:.4f}")  # with -s
        assert 0 < worst <= MAX_BOUND and mean <= MEAN_BOUND, (worst, mean)
