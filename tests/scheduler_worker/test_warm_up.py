"""The CUDA backend's start-up warm-up (backends/warm_up.py) on the CPU, its kernels in the
Triton interpreter: it runs the prompt path and a decode at every split count, writes only
the scratch block, and leaves the steps after it exactly as without it. That it spares a
first request a compile stall is measured by the GPU check (first-request TTFT)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytest.importorskip("triton")

from scheduler_worker.backends.cuda import SPLIT_CHOICES  # noqa: E402
from scheduler_worker.backends.warm_up import warm_up  # noqa: E402
from tests.conftest import save_tiny_llama  # noqa: E402
from tests.scheduler_worker.test_triton_backend import run_steps, triton_runner  # noqa: E402

if torch.cuda.is_available():
    pytest.skip("the GPU runs it at every start (test_cuda_backend.py)", allow_module_level=True)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return save_tiny_llama(
        tmp_path_factory.mktemp("warm_up") / "llama",
        vocab_size=256, hidden_size=384, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=1024,
        initializer_range=0.05, eos_token_id=2, tie_word_embeddings=True,
    )  # fmt: skip


def test_warm_up_writes_only_the_scratch_block_and_changes_no_step(model_dir):
    cold = triton_runner(model_dir)
    expected = run_steps(cold, decode_steps=1)

    runner = triton_runner(model_dir)
    backend, scratch = runner.backend, runner.backend.scratch_block
    before = [(k.clone(), v.clone()) for k, v in runner.kv_caches]
    seconds = warm_up(backend, runner.model, runner.kv_caches, SPLIT_CHOICES)
    assert seconds > 0
    for (k0, v0), (k, v) in zip(before, runner.kv_caches):
        assert torch.equal(k[:scratch], k0[:scratch]) and torch.equal(v[:scratch], v0[:scratch])
        assert not torch.equal(k[scratch], k0[scratch])  # it did write: the prompt's keys
    for got, want in zip(run_steps(runner, decode_steps=1), expected):
        assert torch.equal(got, want)
