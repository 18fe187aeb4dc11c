"""The CUDA backend on a GPU (skipped without one; benchmarks/gpu_check.sh runs it there):
Triton ops and attention, decode graphs, overlapped scheduling and the memory plan,
against the CPU's float32 engine and the backend's own eager steps."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from common.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from common.sampling_params import SamplingParams
from scheduler_worker.engine import LLMEngine
from scheduler_worker.model_runner import ModelRunner, SeqInput
from tests.conftest import save_tiny_llama
from tests.scheduler_worker.family_models import FAMILIES, save_family

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

GREEDY = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    """A tiny random Llama with real head shapes: head_dim 64, 6 query heads over 2 KV heads."""
    return save_tiny_llama(
        tmp_path_factory.mktemp("cuda_tiny") / "llama",
        vocab_size=512, hidden_size=384, intermediate_size=768, num_hidden_layers=3,
        num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=1024,
        initializer_range=0.05, eos_token_id=2, tie_word_embeddings=True,
    )  # fmt: skip


def config(model_dir: Path, device: str, dtype: str, **kw) -> EngineConfig:
    sched = {"max_num_seqs": 16, "max_num_batched_tokens": 256}
    sched.update({k: v for k, v in kw.items() if k in ("async_scheduling",)})
    return EngineConfig(
        model=ModelConfig(
            model=str(model_dir), device=device, dtype=dtype,
            enforce_eager=kw.get("enforce_eager", False),
            # the CPU reference in pure torch: no C++ build on a GPU machine
            kernels="torch" if device == "cpu" else "auto",
        ),
        cache=CacheConfig(
            block_size=16, num_blocks=kw.get("num_blocks", 64), kv_cache_dtype=dtype,
            gpu_memory_utilization=kw.get("utilization", 0.9),
        ),
        scheduler=SchedulerConfig(**sched),
    )  # fmt: skip


PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [3, 4], list(range(20, 60)), [7] * 33]


def step_logits(runner: ModelRunner) -> list[torch.Tensor]:
    """Prefill PROMPTS, then three decode steps of all four: each step's logits, on the CPU."""
    tables = [[0, 1, 2, 3], [4, 5], [6, 7, 8, 9], [10, 11, 12, 13]]
    out = [runner.execute([SeqInput(p, 0, t) for p, t in zip(PROMPTS, tables)]).cpu()]
    for k in range(3):
        seqs = [SeqInput([100 + k], len(p) + k, t) for p, t in zip(PROMPTS, tables)]
        out.append(runner.execute(seqs).float().cpu())
    return out


def test_float32_logits_match_the_cpu_engine(model_dir):
    cpu = step_logits(ModelRunner(config(model_dir, "cpu", "float32", num_blocks=32), model_dir))
    gpu_runner = ModelRunner(config(model_dir, "cuda", "float32", num_blocks=32), model_dir)
    assert gpu_runner.backend.name == "cuda" and gpu_runner.backend.graphs is not None
    gpu = step_logits(gpu_runner)
    for a, b in zip(gpu, cpu):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_family_matches_the_cpu_engine_in_float32(family, tmp_path):
    """Each family's layers on the real kernels and graphs (Gemma 3's per-head norms and
    windows, Qwen3's QK-norm, GPT-2's LayerNorm, ...)."""
    model_dir = save_family(family, tmp_path / family)
    cpu = step_logits(ModelRunner(config(model_dir, "cpu", "float32", num_blocks=32), model_dir))
    gpu = step_logits(ModelRunner(config(model_dir, "cuda", "float32", num_blocks=32), model_dir))
    for a, b in zip(gpu, cpu):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


def test_graph_replays_equal_eager_steps(model_dir):
    graphs = step_logits(
        ModelRunner(config(model_dir, "cuda", "bfloat16", num_blocks=32), model_dir)
    )
    eager_runner = ModelRunner(
        config(model_dir, "cuda", "bfloat16", num_blocks=32, enforce_eager=True), model_dir
    )
    assert eager_runner.backend.graphs is None
    eager = step_logits(eager_runner)
    for a, b in zip(graphs, eager):
        torch.testing.assert_close(a, b, rtol=2e-2, atol=2e-2)


def test_overlapped_engine_gives_the_synchronous_tokens(model_dir):
    outs = []
    for mode in ("on", "off"):
        engine = LLMEngine(config(model_dir, "cuda", "float32", async_scheduling=mode), model_dir)
        assert engine.overlap == (mode == "on")
        assert engine.grammars.overlap  # masks made while the forward runs (masks_overlap)
        outs.append(engine.generate(PROMPTS, GREEDY))
        engine.block_manager.check_integrity()
    assert outs[0] == outs[1]
    assert all(len(o) == GREEDY.max_tokens for o in outs[0])


def test_sampling_kinds_run_overlapped_on_the_gpu(model_dir):
    engine = LLMEngine(config(model_dir, "cuda", "bfloat16"), model_dir)
    params = [
        SamplingParams(max_tokens=8, temperature=0.8, top_p=0.9, seed=3, ignore_eos=True),
        SamplingParams(max_tokens=8, temperature=1.0, top_k=5, min_p=0.05, ignore_eos=True),
        SamplingParams(max_tokens=8, temperature=0.0, logprobs=3, ignore_eos=True),
        SamplingParams(max_tokens=8, temperature=0.7, presence_penalty=0.5, ignore_eos=True),
    ]
    outs = engine.generate(PROMPTS, params)
    assert [len(o) for o in outs] == [8] * 4 and all(0 <= t < 512 for o in outs for t in o)
    again = LLMEngine(config(model_dir, "cuda", "bfloat16"), model_dir).generate(
        [PROMPTS[0]], params[0]
    )
    assert again[0] == outs[0]  # a seeded request repeats, whatever shared its steps


def test_the_kv_pool_takes_what_the_utilization_leaves(model_dir):
    # half the card: the GPU check runs transformers beside this test
    cfg = config(model_dir, "cuda", "bfloat16", num_blocks=None, utilization=0.5)
    runner = ModelRunner(cfg, model_dir)
    facts = runner.backend.facts
    assert facts["kv_pool_bytes"] > 0 and facts["activation_peak_bytes"] > 0
    total = facts["gpu_total_bytes"]
    used = facts["weights_bytes"] + facts["activation_peak_bytes"] + facts["kv_pool_bytes"]
    assert used <= total * facts["utilization"]
    assert runner.num_blocks * 16 > 100_000  # a GPU's pool, not the CPU's 1 GiB default
