"""Decode graphs (backends/graphs.py) without a GPU: the bucket sizes, and a stand-in graph
on the CPU that replays a real model's decode step from the static inputs, padded to its
bucket, as a CUDA graph would."""

from __future__ import annotations

import pytest
import torch

from common.config import CacheConfig, EngineConfig, ModelConfig
from scheduler_worker.backends.graphs import (
    DecodeGraphs,
    StandInGraph,
    StaticDecodeInputs,
    bucket_for,
    capture_sizes,
)
from scheduler_worker.model_runner import ModelRunner, SeqInput
from tests.conftest import kernels_built


def test_capture_sizes_are_vllms_buckets():
    assert capture_sizes(1) == [1]
    assert capture_sizes(4) == [1, 2, 4]
    assert capture_sizes(6) == [1, 2, 4, 6]
    assert capture_sizes(8) == [1, 2, 4, 8]
    assert capture_sizes(64) == [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64]
    assert capture_sizes(100)[-1] == 104 and capture_sizes(256)[-2:] == [248, 256]


def test_a_batch_takes_the_smallest_bucket_that_holds_it():
    sizes = capture_sizes(64)
    assert [bucket_for(n, sizes) for n in (1, 2, 3, 5, 9, 16, 17, 64)] == [
        1, 2, 4, 8, 16, 16, 24, 64,
    ]  # fmt: skip
    assert bucket_for(65, sizes) is None


@pytest.fixture(scope="module")
def runner(tiny_model_dirs):
    if not kernels_built():
        pytest.skip("the C++ kernels are not built")
    cfg = EngineConfig(
        model=ModelConfig(model=str(tiny_model_dirs["llama"]), dtype="float32"),
        cache=CacheConfig(block_size=4, num_blocks=64, kv_cache_dtype="float32"),
    )
    return ModelRunner(cfg, tiny_model_dirs["llama"])


def make_graphs(runner: ModelRunner, sizes: list[int]) -> DecodeGraphs:
    b = runner.backend
    cpu = torch.device("cpu")
    inputs = StaticDecodeInputs(max(sizes), 16, cpu, runner.num_blocks, runner.block_size)
    graphs = DecodeGraphs(inputs, sizes, lambda n: inputs.meta(n, b.decode_kernel, b.isa_index, 1))
    with torch.inference_mode():
        for size in reversed(sizes):
            g = StandInGraph(graphs.step_fn(runner.model, runner.kv_caches, size))
            graphs.add(size, g, g.output)
    return graphs


def test_a_padded_replay_equals_the_eager_step_and_writes_only_its_slots(runner):
    prompts = [[5, 6, 7, 8, 9], [3, 4], [10, 11, 12, 13, 14, 15, 16]]
    tables = [[0, 1], [2], [3, 4]]
    with torch.inference_mode():
        runner.execute([SeqInput(p, 0, t) for p, t in zip(prompts, tables)])
    graphs = make_graphs(runner, [1, 2, 4, 8])
    decode = [SeqInput([20 + i], len(p), t) for i, (p, t) in enumerate(zip(prompts, tables))]
    with torch.inference_mode():
        eager = runner.execute(decode).clone()
        before = [k.clone() for k, _ in runner.kv_caches]
        replayed = graphs.replay(decode, None)
    assert replayed.shape == eager.shape  # 3 rows of the 4-row bucket
    torch.testing.assert_close(replayed, eager, rtol=1e-5, atol=1e-5)
    scratch = runner.num_blocks
    for (k, _), k0 in zip(runner.kv_caches, before):
        # the eager step's K where the rows' tokens go (to rounding: 4 rows, not 3, went
        # through the matmuls); the padding row wrote only the scratch block
        torch.testing.assert_close(k[:scratch], k0[:scratch], rtol=1e-5, atol=1e-6)
        assert not torch.equal(k[scratch], k0[scratch])


def test_a_placeholder_token_is_read_from_the_step_in_flight(runner):
    prompts = [[5, 6, 7], [8, 9]]
    tables = [[5], [6]]
    with torch.inference_mode():
        runner.execute([SeqInput(p, 0, t) for p, t in zip(prompts, tables)])
    graphs = make_graphs(runner, [1, 2])
    known = [SeqInput([31], 3, [5]), SeqInput([42], 2, [6])]
    in_flight = torch.tensor([42, 99, 31])  # that step's tokens, by its rows
    pending = [SeqInput([-1], 3, [5], prev_row=2), SeqInput([-1], 2, [6], prev_row=0)]
    with torch.inference_mode():
        want = graphs.replay(known, None).clone()
        got = graphs.replay(pending, in_flight).clone()
        runner.backend.prev_tokens = in_flight
        eager = runner.execute(pending)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(eager, want, rtol=1e-5, atol=1e-5)


def test_graphs_of_a_kind_share_one_logits_buffer():
    """The largest graph's warm-up allocates it; smaller ones write its first rows; a
    larger one after that is a bug (an earlier graph writes the buffer), said at capture."""
    from scheduler_worker.backends.graphs import SharedLogits

    shared = SharedLogits()
    big = shared.put(torch.ones(8, 5))
    small = shared.put(torch.full((3, 5), 2.0))
    assert small.data_ptr() == big.data_ptr() and small.shape == (3, 5)
    assert bool((big[:3] == 2.0).all()) and bool((big[3:] == 1.0).all())
    with pytest.raises(RuntimeError, match="past the shared"):
        shared.put(torch.zeros(9, 5))
    with pytest.raises(RuntimeError, match="past the shared"):
        shared.put(torch.zeros(2, 6))
