"""A greedy step's argmax taken by the quantized output head itself (QuantLinear.argmax,
torch.ops.zeroserve.qlinear_argmax), the logits never written: the tokens the logits'
argmax gives, through the layer, the model runner and the engine; and the layers and
models that cannot take it say so (None), so the step computes the logits."""

from __future__ import annotations

import gguf
import pytest
import torch

from common.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from common.sampling_params import SamplingParams
from scheduler_worker.engine import LLMEngine
from scheduler_worker.model_runner import SeqInput
from scheduler_worker.quant.formats import from_gguf, quantize_q8
from scheduler_worker.quant.linear import QuantLinear
from tests.conftest import kernels_built

pytestmark = pytest.mark.skipif(not kernels_built(), reason="the C++ kernels are not built here")

PROMPTS = [[1, 504, 3156, 282, 4704, 30], [1, 42, 43, 44], list(range(300, 340))]


@pytest.fixture(scope="module")
def engine(default_model_dir) -> LLMEngine:
    """The default model as served: its GGUF's own blocks, the tied Q8_0 head; no drafts
    (the tests count the head's calls a plain step makes)."""
    cfg = EngineConfig(
        model=ModelConfig(model="smollm2", dtype="float32"),
        cache=CacheConfig(num_blocks=64),
        scheduler=SchedulerConfig(
            max_num_seqs=8, max_num_batched_tokens=256, speculative_method="none"
        ),
    )
    return LLMEngine(cfg, default_model_dir)


def test_the_runner_gives_the_logits_argmax_as_tokens(engine):
    runner, vocab = engine.runner, engine.sampler.vocab_size
    assert isinstance(runner.model.lm_head, QuantLinear)
    tables = [[10 * i + b for b in range(4)] for i in range(len(PROMPTS))]
    prefill = [SeqInput(p, 0, t) for p, t in zip(PROMPTS, tables)]
    for cut in (vocab, 1000):  # 1000: only the first 1000 logits count
        tokens = runner.execute(prefill, argmax_vocab=cut)
        logits = runner.execute(prefill)  # the same K/V written again
        assert tokens.dtype == torch.int64 and logits.dtype == torch.float32
        assert torch.equal(tokens, logits[:, :cut].max(dim=-1).indices), cut
    decode = [SeqInput([int(t)], len(p), tab) for p, t, tab in zip(PROMPTS, tokens, tables)]
    assert torch.equal(runner.execute(decode, vocab), runner.execute(decode).argmax(dim=-1))


def test_the_engine_takes_the_heads_argmax_only_where_the_sampler_would_take_the_argmax(
    engine, monkeypatch
):
    """Greedy without logprobs: the head's argmax, never the sampler; with logprobs (the
    logits needed), or sampling, the logits. Both greedy runs give the same tokens."""
    model, taken = engine.runner.model, []
    greedy_tokens = model.greedy_tokens

    def spy(hidden, vocab):
        taken.append(hidden.shape[0])
        return greedy_tokens(hidden, vocab)

    monkeypatch.setattr(model, "greedy_tokens", spy)
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    fused = engine.generate(PROMPTS, params)
    assert len(taken) == 12 and taken[0] == len(PROMPTS)  # one prefill step, 11 decode
    taken.clear()
    with_logits = engine.generate(
        PROMPTS, SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True, logprobs=0)
    )
    assert with_logits == fused and taken == []
    mixed = [params, SamplingParams(max_tokens=4, temperature=0.8, seed=1), params]
    engine.generate(PROMPTS, mixed)
    assert len(taken) == 8  # the steps after the sampled request finished
    engine.block_manager.check_integrity()


def test_layers_and_models_that_cannot_take_the_argmax_say_none(tiny_model_dirs):
    w = quantize_q8(torch.randn(40, 64, generator=torch.Generator().manual_seed(0)))
    x = torch.randn(3, 64)
    lin = QuantLinear(w, None, torch.float32, "scalar")
    assert torch.equal(lin.argmax(x, 40), lin(x).max(dim=-1).indices)
    assert QuantLinear(w, None, torch.float32, None).argmax(x, 40) is None  # pure torch
    assert QuantLinear(w, torch.ones(40), torch.float32, "scalar").argmax(x, 40) is None
    raw = gguf.quants.quantize(torch.randn(40, 64).numpy(), gguf.GGMLQuantizationType.Q5_0)
    q5 = QuantLinear(from_gguf(raw, "Q5_0", 40, 64), None, torch.float32, "scalar")
    # every format runs through the kernels' one (format, ISA) table, the 5-bit ones too
    assert torch.equal(q5.argmax(x, 40), q5(x).max(dim=-1).indices)
    # a float head (gpt2's tied nn.Linear): the runner returns logits
    cfg = EngineConfig(
        model=ModelConfig(model=str(tiny_model_dirs["gpt2"]), dtype="float32"),
        cache=CacheConfig(block_size=4, num_blocks=16),
    )
    runner = LLMEngine(cfg, tiny_model_dirs["gpt2"]).runner
    out = runner.execute([SeqInput([5, 6, 7], 0, [0])], argmax_vocab=100)
    assert out.dtype == torch.float32 and out.shape[0] == 1
