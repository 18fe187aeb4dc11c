"""The plain-torch models over paged KV equal transformers, token for token (float32)."""

from __future__ import annotations

import json

import pytest
import torch

from common.config import CacheConfig, ConfigError, EngineConfig, ModelConfig
from common.sampling_params import SamplingParams
from scheduler_worker.model_runner import ModelRunner, SeqInput
from scheduler_worker.models import UnsupportedModelError
from tests.conftest import TINY_KINDS, hf_greedy, kernels_built

PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [3, 4, 100, 200, 300], [7] * 13, [42], list(range(20, 60))]


def _config(model_dir, **cache) -> EngineConfig:
    return EngineConfig(
        model=ModelConfig(model=str(model_dir), dtype="float32"),
        cache=CacheConfig(**{"block_size": 4, "num_blocks": 256, **cache}),
    )


def _runner(model_dir, **cache) -> ModelRunner:
    return ModelRunner(_config(model_dir, **cache), model_dir)


def _greedy_paged(runner: ModelRunner, prompts, max_new: int, first_block: int = 0):
    """Batched prefill of all prompts in one forward, then batched decode."""
    bs = runner.block_size
    per_seq = -(-(max(map(len, prompts)) + max_new) // bs)
    tables = [
        list(range(first_block + i * per_seq, first_block + (i + 1) * per_seq))
        for i in range(len(prompts))
    ]
    seqs = [list(p) for p in prompts]
    outs: list[list[int]] = [[] for _ in prompts]
    logits = runner.execute([SeqInput(list(p), 0, t) for p, t in zip(prompts, tables)])
    for step in range(max_new):
        tokens = logits.argmax(-1).tolist()
        for out, t in zip(outs, tokens):
            out.append(t)
        if step == max_new - 1:
            break
        inputs = [SeqInput([t], len(s), tab) for s, t, tab in zip(seqs, tokens, tables)]
        for s, t in zip(seqs, tokens):
            s.append(t)
        logits = runner.execute(inputs)
    return outs


@pytest.mark.parametrize("kind", TINY_KINDS)
def test_tiny_greedy_equals_transformers(kind, tiny_model_dirs):
    model_dir = tiny_model_dirs[kind]
    expected = hf_greedy(model_dir, PROMPTS, 24)
    assert _greedy_paged(_runner(model_dir), PROMPTS, 24) == expected


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_engine_generate_equals_transformers(kind, tiny_model_dirs):
    from scheduler_worker.engine import LLMEngine

    model_dir = tiny_model_dirs[kind]
    engine = LLMEngine(_config(model_dir), model_dir)
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    assert engine.generate(PROMPTS, params) == hf_greedy(model_dir, PROMPTS, 24)


def test_batch_of_different_lengths_equals_each_alone(tiny_model_dirs):
    runner = _runner(tiny_model_dirs["qwen2"])
    together = _greedy_paged(runner, PROMPTS, 16)
    alone = [_greedy_paged(runner, [p], 16, first_block=100)[0] for p in PROMPTS]
    assert together == alone


def test_kv_cache_dtype_auto_and_a_type_the_decode_path_cannot_read(tiny_model_dirs):
    """auto: float16 K/V under a float32 model on the paged kernel, else the model's
    dtype; a float16 cache asked of the pure-torch path is refused at start, naming the
    flag, rather than served wrong."""
    model_dir = tiny_model_dirs["llama3"]

    def runner(kernels: str, kv: str) -> ModelRunner:
        model = ModelConfig(model=str(model_dir), dtype="float32", kernels=kernels)
        cache = CacheConfig(block_size=4, num_blocks=16, kv_cache_dtype=kv)
        return ModelRunner(EngineConfig(model=model, cache=cache), model_dir)

    assert runner("torch", "auto").kv_caches[0][0].dtype == torch.float32
    with pytest.raises(ConfigError, match="--kv-cache-dtype float16"):
        runner("torch", "float16")
    with pytest.raises(ConfigError, match="kv_cache_dtype must be one of"):
        CacheConfig(kv_cache_dtype="int8")
    if kernels_built():
        r = runner("auto", "auto")
        assert r.decode_kernel == "paged" and r.kv_caches[0][0].dtype == torch.float16
        assert runner("auto", "float32").kv_caches[0][1].dtype == torch.float32


@pytest.mark.parametrize("kv_dtype,tol", [("float32", 1e-4), ("auto", 1e-4)])
def test_prefix_in_cache_then_tail_prefill_equals_full_prefill(tiny_model_dirs, kv_dtype, tol):
    """A tail prefilled over a cached prefix (and chunked prefill) gives the logits of the
    whole prompt at once, to float rounding, with a float32 cache and with the default one
    (float16 where the paged kernel runs: a fresh prompt attends to its K/V rounded as the
    cache holds them, so a prefix from the cache changes nothing)."""
    runner = _runner(tiny_model_dirs["llama3"], kv_cache_dtype=kv_dtype)
    prompt = list(range(30, 67))  # 37 tokens: 9 full blocks of 4 + 1
    full = runner.execute([SeqInput(prompt, 0, list(range(10)))])
    # a second sequence shares the first 8 blocks (32 tokens) and computes only the tail
    table = list(range(8)) + [20, 21]
    tail = runner.execute([SeqInput(prompt[32:], 32, table)])
    torch.testing.assert_close(tail, full, rtol=tol, atol=tol)
    # chunked: the same prompt in 3 chunks of a fresh table, mixed with a decode of another seq
    table2 = list(range(40, 50))
    runner.execute([SeqInput(prompt[:13], 0, table2, sample=False)])
    runner.execute([SeqInput(prompt[13:30], 13, table2, sample=False)])
    mixed = runner.execute([SeqInput([prompt[0]], 0, [60]), SeqInput(prompt[30:], 30, table2)])
    torch.testing.assert_close(mixed[1:], full, rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "auto"])
def test_other_dtypes_run_and_agree_on_top_token(dtype, each_cpu_kind, tiny_model_dirs):
    """auto: bfloat16 where the CPU multiplies bf16 natively (avx512, amx), else float32
    (avx2), whose K/V cache is float16 where the paged kernel decodes (kv_cache_dtype)."""
    model_dir = tiny_model_dirs["llama3"]
    ref = _runner(model_dir).execute([SeqInput(PROMPTS[4], 0, list(range(20)))])
    cfg = EngineConfig(
        model=ModelConfig(model=str(model_dir), dtype=dtype),
        cache=CacheConfig(block_size=4, num_blocks=64),
    )
    runner = ModelRunner(cfg, model_dir)
    auto = torch.float32 if each_cpu_kind == "avx2" else torch.bfloat16
    assert runner.dtype == (auto if dtype == "auto" else getattr(torch, dtype))
    f16_cache = runner.dtype == torch.float32 and kernels_built()  # the paged kernel's cache
    assert runner.kv_caches[0][0].dtype == (torch.float16 if f16_cache else runner.dtype)
    out = runner.execute([SeqInput(PROMPTS[4], 0, list(range(20)))])
    assert torch.isfinite(out).all()
    top_ref = set(ref[0].topk(5).indices.tolist())
    assert out[0].argmax().item() in top_ref


def test_unknown_architecture_is_refused_with_supported_list(tmp_path, tiny_model_dirs):
    src = tiny_model_dirs["qwen2"]
    for f in src.iterdir():
        (tmp_path / f.name).write_bytes(f.read_bytes())
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["architectures"] = ["FalconForCausalLM"]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UnsupportedModelError) as e:
        _runner(tmp_path)
    assert "FalconForCausalLM" in str(e.value) and "LlamaForCausalLM" in str(e.value)


@pytest.mark.parametrize("kind", TINY_KINDS)
def test_matmul_decode_kernel_equals_transformers(kind, tiny_model_dirs, monkeypatch):
    """The decode attention picked for half precision on a CPU without AMX (grouped
    matmuls instead of SDPA) gives transformers' greedy tokens too (GQA included)."""
    monkeypatch.setenv("ZEROSERVE_DECODE_ATTENTION", "matmul")
    model_dir = tiny_model_dirs[kind]
    runner = _runner(model_dir)
    assert runner.decode_kernel == "matmul"
    assert _greedy_paged(runner, PROMPTS, 24) == hf_greedy(model_dir, PROMPTS, 24)


def test_decode_kernel_choice(monkeypatch):
    from scheduler_worker.attention import choose_decode_kernel

    monkeypatch.delenv("ZEROSERVE_DECODE_ATTENTION", raising=False)
    amd = "flags : avx2 avx512f avx512_bf16"
    intel = "flags : avx2 avx512f avx512_bf16 amx_bf16 amx_tile"
    assert choose_decode_kernel(torch.bfloat16, amd) == "matmul"
    assert choose_decode_kernel(torch.float16, amd) == "matmul"
    assert choose_decode_kernel(torch.bfloat16, intel) == "sdpa"
    assert choose_decode_kernel(torch.float32, amd) == "sdpa"
    assert choose_decode_kernel(torch.float32, amd, paged=True) == "paged"
    monkeypatch.setenv("ZEROSERVE_DECODE_ATTENTION", "sdpa")
    assert choose_decode_kernel(torch.bfloat16, amd) == "sdpa"
    monkeypatch.setenv("ZEROSERVE_DECODE_ATTENTION", "flash")
    with pytest.raises(ValueError, match="ZEROSERVE_DECODE_ATTENTION"):
        choose_decode_kernel(torch.bfloat16, amd)
