"""Tensor parallelism on the CPU (gloo): greedy tokens of tp=2 equal tp=1's and
transformers', float32, on tiny random models of each shape that splits differently:
grouped KV heads and an odd vocabulary (the last rank's rows padded), fewer KV heads than
ranks (replicated) with tied embeddings, Qwen2's q/k/v biases, Phi-3's fused projections,
Gemma 3 (sandwich norms, QK-norm, a sliding-window layer, softcapped logits off).

The test process is rank 0 (parallel.ranks.start_ranks starts rank 1 as a subprocess);
the partition, the step channel's encoding and the refusals are tested without one."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import torch

from common.config import CacheConfig, Config, ConfigError, EngineConfig, ModelConfig
from common.sampling_params import SamplingParams
from scheduler_worker.backends.base import DecodeRows, SeqInput
from scheduler_worker.backends.block_tables import BlockTables
from scheduler_worker.engine import LLMEngine
from scheduler_worker.models.common import ModelArgs
from scheduler_worker.parallel.partition import plan_partition
from scheduler_worker.parallel.ranks import start_ranks
from scheduler_worker.parallel.step_channel import EXECUTE, decode, encode
from tests.conftest import hf_greedy, randomize_qkv_bias, tiny_config
from tests.scheduler_worker.family_models import save_family

pytestmark = pytest.mark.timeout(300)
PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [3, 4, 100, 200, 201], [7] * 13, [42], list(range(20, 60))]
MAX_NEW = 12


def _save(name: str, out: Path) -> Path:
    import transformers

    torch.manual_seed(0)
    if name in ("gemma3", "phi3"):
        return save_family(name, out)
    if name == "qwen2":
        config = tiny_config("Qwen2Config", vocab_size=512, tie_word_embeddings=True)
        model = transformers.Qwen2ForCausalLM(config).eval()
        randomize_qkv_bias(model)
    else:
        kv = {"llama-gqa": 2, "llama-kv1": 1}[name]
        config = tiny_config(
            "LlamaConfig",
            vocab_size=501 if kv == 2 else 512,  # 501: the second rank's rows padded
            num_key_value_heads=kv,
            tie_word_embeddings=kv == 1,
        )
        model = transformers.LlamaForCausalLM(config).eval()
    model.save_pretrained(out)
    return out


def engine_config(model_dir: Path, tp: int, **cache) -> EngineConfig:
    return EngineConfig(
        model=ModelConfig(model=str(model_dir), dtype="float32", tensor_parallel_size=tp),
        cache=CacheConfig(**{"block_size": 4, "num_blocks": 256, **cache}),
    )


@contextmanager
def tp_engine(model_dir: Path, tp: int) -> Iterator[LLMEngine]:
    """An engine whose model is split over `tp` ranks (this process rank 0)."""
    config = engine_config(model_dir, tp)
    ranks = start_ranks(Config(engine=config))
    try:
        yield LLMEngine(config, model_dir)
    finally:
        if ranks is not None:
            ranks.stop()


def greedy(engine: LLMEngine) -> list[list[int]]:
    params = SamplingParams(max_tokens=MAX_NEW, temperature=0.0, ignore_eos=True)
    return engine.generate(PROMPTS, params)


@pytest.mark.parametrize("name", ["llama-gqa", "llama-kv1", "qwen2", "phi3", "gemma3"])
def test_tp2_greedy_equals_tp1_and_transformers(name, tmp_path):
    model_dir = _save(name, tmp_path / name)
    expected = hf_greedy(model_dir, PROMPTS, MAX_NEW)
    with tp_engine(model_dir, 1) as engine:
        assert greedy(engine) == expected
        kv_heads = engine.runner.kv_caches[0][0].shape[2]
    with tp_engine(model_dir, 2) as engine:
        assert greedy(engine) == expected
        # each rank holds its share of the KV heads (a replicated one when fewer than ranks)
        assert engine.runner.kv_caches[0][0].shape[2] == max(1, kv_heads // 2)
        assert engine.runner.tp is not None and engine.runner.tp.all_reduces > 0


def test_tp2_offline_creates_its_private_run_dir(tmp_path, monkeypatch):
    """An offline engine (no launch.py, no component start before it) writes the followers'
    config into the run dir: a missing one is created, mode 0700, not a FileNotFoundError."""
    run_dir = tmp_path / "run"
    monkeypatch.setenv("ZEROSERVE_RUN_DIR", str(run_dir))
    model_dir = _save("llama-gqa", tmp_path / "m")
    with tp_engine(model_dir, 2) as engine:
        assert run_dir.is_dir() and run_dir.stat().st_mode & 0o777 == 0o700
        assert greedy(engine)[0] == hf_greedy(model_dir, PROMPTS[:1], MAX_NEW)[0]


def test_tp2_prompt_logits_and_logits_equal_tp1(tmp_path):
    """The step with prompt logits (followers make the same per-sequence head calls) and
    a mixed step's logits agree with tp=1's to float32 rounding; a greedy step's tokens
    from the vocabulary-parallel head's argmax are the full logits' argmax."""
    model_dir = _save("llama-gqa", tmp_path / "m")
    seqs = [
        SeqInput(list(range(3, 20)), 0, list(range(1, 6)), prompt_logits=16),
        SeqInput([9, 8, 7], 0, [10], prompt_logits=0),
    ]
    got = []
    decode = [SeqInput([11], 17, list(range(1, 6))), SeqInput([12], 3, [10])]
    for tp in (1, 2):
        with tp_engine(model_dir, tp) as engine:
            logits, extra = engine.runner.execute_with_prompt_logits(seqs)
            got.append((logits, extra[0]))
            # a greedy step: the head's own argmax (tp=2: each rank's best, compared on
            # rank 0) is the argmax of the whole logits, and the vocabulary cut holds
            full = engine.runner.execute(decode)
            for vocab in (501, 300, 200) if tp == 2 else ():
                tokens = engine.runner.execute(decode, argmax_vocab=vocab)
                assert tokens.dtype == torch.long
                assert tokens.tolist() == full[:, :vocab].argmax(-1).tolist()
    (a, pa), (b, pb) = got
    assert a.shape == b.shape == (2, 501) and pa is not None and pb is not None
    torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(pa, pb, atol=1e-4, rtol=1e-4)


def test_tp2_with_ngram_drafts_equals_tp1(tmp_path):
    """Speculative verify steps (drafted chunks whose argmaxes the head takes per position,
    the prompt-logits call) run on both ranks alike: the same tokens as tp=1's."""
    from dataclasses import replace

    model_dir = _save("llama-gqa", tmp_path / "m")
    prompts = [[5, 6, 7, 8, 5, 6, 7, 8, 5, 6, 7], [9, 10, 11] * 5]
    params = SamplingParams(max_tokens=MAX_NEW, temperature=0.0, ignore_eos=True)
    outs = []
    for tp in (1, 2):
        config = engine_config(model_dir, tp)
        config = replace(config, scheduler=replace(config.scheduler, speculative_method="ngram"))
        ranks = start_ranks(Config(engine=config))
        try:
            engine = LLMEngine(config, model_dir)
            outs.append(engine.generate(prompts, params))
            assert engine.counters.draft_tokens > 0
        finally:
            if ranks is not None:
                ranks.stop()
    assert outs[0] == outs[1]


def test_a_dead_follower_is_named_at_rank_0s_next_beat(tmp_path):
    model_dir = _save("llama-kv1", tmp_path / "m")
    ranks = start_ranks(Config(engine=engine_config(model_dir, 2)))
    assert ranks is not None
    try:
        LLMEngine(engine_config(model_dir, 2), model_dir)
        ranks.keepalive()  # both there: a no-op step
        ranks.procs[0].kill()
        ranks.procs[0].wait()
        with pytest.raises(RuntimeError, match="rank 1 .* exited with code -9"):
            ranks.keepalive()
    finally:
        ranks.stop(graceful=False)
        ranks.group.close()  # this process's group, for the next test's


def _args(heads: int, kv: int, arch: str = "LlamaForCausalLM", vocab: int = 10) -> ModelArgs:
    return ModelArgs(
        arch, vocab, 64, 30, 2, heads, kv, 16, 64, 1e-6, "silu", False, False, False, False, {}
    )


def test_partition_splits_heads_by_kv_group():
    # 9 heads over 3 KV heads (the default model's) on 2 ranks: whole groups, 2 and 1
    parts = [plan_partition(_args(9, 3), r, 2) for r in range(2)]
    assert [(p.q_heads, p.kv_heads) for p in parts] == [((0, 6), (0, 2)), ((6, 9), (2, 3))]
    assert [p.inter for p in parts] == [(0, 15), (15, 30)]
    assert [(p.vocab, p.vocab_rows) for p in parts] == [((0, 5), 5), ((5, 10), 5)]
    # fewer KV heads than ranks: each held by 2 ranks, its 4 queries split 2 and 2
    parts = [plan_partition(_args(8, 2, vocab=11), r, 4) for r in range(4)]
    assert [(p.q_heads, p.kv_heads) for p in parts] == [
        ((0, 2), (0, 1)),
        ((2, 4), (0, 1)),
        ((4, 6), (1, 2)),
        ((6, 8), (1, 2)),
    ]
    assert [p.vocab for p in parts][-1] == (9, 11) and parts[-1].vocab_rows == 3
    assert parts[1].local_args(_args(8, 2)).num_heads == 2


def test_partitions_that_do_not_split_are_refused_in_one_line():
    with pytest.raises(ConfigError, match="query heads to split evenly"):
        plan_partition(_args(6, 2), 0, 4)  # 3 queries a KV head over 2 ranks
    with pytest.raises(ConfigError, match="GPT2LMHeadModel.s checkpoint layout is not sharded"):
        plan_partition(_args(4, 4, "GPT2LMHeadModel"), 0, 2)


def test_quantized_shards_are_refused_and_auto_takes_float(tmp_path):
    from scheduler_worker.quant.plan import plan_weights

    cfg = ModelConfig(quantization="int8", tensor_parallel_size=2)
    with pytest.raises(ConfigError, match="float weights for now"):
        plan_weights(cfg, torch.device("cpu"), None)
    fp8 = ModelConfig(quantization="fp8", tensor_parallel_size=2)
    with pytest.raises(ConfigError, match="--quantization fp8 with --tensor-parallel-size 2"):
        plan_weights(fp8, torch.device("cpu"), None)
    with pytest.raises(ConfigError, match="of a float or GGUF checkpoint"):  # FP8 as stored
        plan_weights(ModelConfig(tensor_parallel_size=2), torch.device("cpu"), None, True)
    auto = plan_weights(
        ModelConfig(tensor_parallel_size=2), torch.device("cpu"), tmp_path / "m.gguf"
    )
    assert auto.method == "none" and "m.gguf" in auto.reason


def test_step_channel_round_trips_both_forms():
    seqs = [
        SeqInput([1, 2, 3], 4, [7, 8], sample=False, prompt_logits=2),
        SeqInput([9], 12, [3, 4, 5, 6], prev_row=1, slot=5, draft=True),
        SeqInput([5, 6, 7], 9, [3, 4, 5], True, 2, slot=2, draft=True, verify=True),
    ]
    step = decode(encode(EXECUTE, seqs, 77))
    assert step.kind == EXECUTE and step.argmax_vocab == 77 and step.seqs == seqs
    tables = BlockTables(8, pad=99, width=4)
    for slot, blocks in ((2, [1, 2, 3]), (5, [4])):
        tables.write(slot, 0, blocks)
    rows = DecodeRows([10, 11], [9, 2], [2, 5], [-1, -1], tables)
    got = decode(encode(EXECUTE, rows, None)).seqs
    assert isinstance(got, DecodeRows)
    assert got.token_ids == [10, 11] and got.positions == [9, 2] and got.prev_rows == [-1, -1]
    assert [s.block_table for s in got.seqs()] == [[1, 2, 3], [4]]
    for bs in (4, 8):  # what the backends stage from them is the same
        for x, y in zip(got.staged(bs, 4), rows.staged(bs, 4)):
            np.testing.assert_array_equal(x, y)


def test_gguf_shards_put_together_are_the_dequantized_matrices(default_model_dir):
    """The default model's GGUF (Q8_0 embedding, Q4_1 layers, llama.cpp's permuted q/k):
    each rank's rows and block-aligned columns, dequantized, side by side equal the whole
    matrices dequantized (gguf_matrices, the float path's oracle)."""
    from itertools import islice

    from common.model_facts import read_hf_config
    from common.model_files.gguf_convert import gguf_matrices
    from common.model_files.model_source import gguf_source
    from scheduler_worker.models import architecture_of, servable_args
    from scheduler_worker.parallel.weights import gguf_shards

    hf = read_hf_config(default_model_dir)
    args = servable_args(hf, architecture_of(hf))
    gguf = gguf_source(default_model_dir)
    assert gguf is not None
    parts = [plan_partition(args, r, 2) for r in range(2)]
    shards = [gguf_shards(gguf, p, args) for p in parts]
    names = set()
    for (name, whole), (n0, a), (n1, b) in islice(zip(gguf_matrices(gguf), *shards), 12):
        assert name == n0 == n1
        names.add(name.split(".")[-2])
        dim = 1 if name.split(".")[-2] in ("o_proj", "down_proj") else 0
        joined = torch.cat([a, b], dim=dim)[: whole.shape[0]]
        torch.testing.assert_close(joined, torch.from_numpy(whole), rtol=0, atol=0)
    assert {"embed_tokens", "q_proj", "k_proj", "o_proj", "down_proj", "gate_proj"} <= names
