"""The one-call decode step (torch.ops.zeroserve.decode_layers, models/decode_plan.py) for
the current families: Qwen 3 (QK-norm), Phi-3 (a sliding window) and Gemma 3 (sandwich
norms, QK-norm, GELU-tanh, two RoPE bases, sliding and global layers). Tiny random
checkpoints quantized to the integer kernels; every decode step through the one call
against the same step through the modules, with contexts that cross the windows; then
whole engines, which give back the blocks before the windows, with and without the plan.

And the three kernels it added: the decode attention's window, GELU-tanh(gate) * up and
the per-head RMSNorm, against torch.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from common.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from common.sampling_params import SamplingParams
from scheduler_worker import kernels
from scheduler_worker.model_runner import ModelRunner, SeqInput
from scheduler_worker.models.decode_plan import GELU_TANH, QK_NORM, SANDWICH
from tests.scheduler_worker.test_families import PROMPTS, family_dirs  # noqa: F401

pytestmark = pytest.mark.skipif(not kernels.load(), reason="the C++ kernels are not built here")
ISAS = [  # every path this CPU runs, the portable one included
    kernels.isa_index(i)
    for i in kernels.ISAS
    if kernels.load() and kernels.isa_index(i) <= kernels.isa_index(kernels.best_isa())
]
STYLES = {"qwen3": QK_NORM, "phi3": 0, "gemma3": QK_NORM | SANDWICH | GELU_TANH}


def _config(model_dir, num_blocks=64) -> EngineConfig:
    return EngineConfig(
        model=ModelConfig(model=str(model_dir), dtype="float32", quantization="int8"),
        cache=CacheConfig(block_size=4, num_blocks=num_blocks),
        scheduler=SchedulerConfig(max_num_batched_tokens=16),
    )


@pytest.mark.parametrize("kind", sorted(STYLES))
def test_decode_steps_in_one_call_equal_the_modules(kind, family_dirs):  # noqa: F811
    """Six decode steps of three sequences (contexts 5, 12 and 25 at the start, across
    Gemma's window of 6 and Phi-3's of 9): logits and KV cache of the one call against the
    modules'. Llama-family models run the same kernels in the same order: bit for bit.
    Gemma's modules use torch for its norms, RoPE and activation: within float rounding."""
    runner = ModelRunner(_config(family_dirs[kind]), family_dirs[kind])
    plan = runner.model.decode_plan
    assert plan is not None and plan.style == STYLES[kind]
    windows = [w or 0 for w in runner.args.layer_windows] or [0] * runner.args.num_layers
    assert plan.layer_windows == windows
    if kind == "gemma3":
        assert plan.layer_rope == [0, 0, 1, 0]  # local, local, global, local
    lens = [5, 12, 25]
    tables = [list(range(1 + 10 * i, 11 + 10 * i)) for i in range(len(lens))]
    for i, n in enumerate(lens):  # the prompts, through the modules
        runner.execute([SeqInput(list(range(10 + i, 10 + i + n)), 0, tables[i])])
    for step in range(6):
        seqs = [SeqInput([7 + i + step], n + step, tables[i]) for i, n in enumerate(lens)]
        caches = [(k.clone(), v.clone()) for k, v in runner.kv_caches]
        meta = runner.prepare(seqs)[2]
        runner.step_rows.set_step(meta.num_decode)
        assert plan.takes(meta, len(seqs))
        fused = runner.execute(seqs)
        fused_caches = [(k.clone(), v.clone()) for k, v in runner.kv_caches]
        runner.kv_caches[:] = caches
        runner.model.decode_plan = None
        modules = runner.execute(seqs)
        runner.model.decode_plan = plan
        if kind == "gemma3":
            torch.testing.assert_close(fused, modules, rtol=1e-4, atol=1e-4)
            assert torch.equal(fused.argmax(-1), modules.argmax(-1))
        else:
            assert torch.equal(fused, modules)
        for (k1, v1), (k2, v2) in zip(fused_caches, runner.kv_caches):
            if kind == "gemma3":  # within one unit of the cache's last place (float16)
                tol = 1e-4 if k1.dtype == torch.float32 else 1e-3
                torch.testing.assert_close(k1, k2, rtol=tol, atol=tol)
                torch.testing.assert_close(v1, v2, rtol=tol, atol=tol)
            else:
                assert torch.equal(k1, k2) and torch.equal(v1, v2)


@pytest.mark.parametrize("kind", ["gemma3", "phi3"])
def test_engines_with_and_without_the_plan_agree_past_the_window(kind, family_dirs):  # noqa: F811
    """The engine gives back the blocks wholly before every window (their table entries
    then name the placeholder block): the one call must never read them. Greedy tokens
    with the plan equal those through the modules."""
    from scheduler_worker.engine import LLMEngine

    params = SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True)
    with_plan = LLMEngine(_config(family_dirs[kind], 128), family_dirs[kind])
    assert with_plan.runner.model.decode_plan is not None
    without = LLMEngine(_config(family_dirs[kind], 128), family_dirs[kind])
    without.runner.model.decode_plan = None
    assert with_plan.generate(PROMPTS, params) == without.generate(PROMPTS, params)
    with_plan.block_manager.check_integrity()


def test_the_steps_threads_give_one_threads_bits_and_pass_on_its_errors(family_dirs):  # noqa: F811
    """On 2 threads decode_layers holds them as one team for the step (kernels/csrc/
    zs_team.h): its logits and KV cache equal the 1-thread step's bit for bit, and an op's
    error inside the team's region (a KV slot outside the cache) comes back as a
    RuntimeError, after which the step runs again. At 1, 3, 8 and 32 rows: the norms, RoPE
    and the activation split by rows from 8 (test_decode_splits.py, op by op)."""
    runner = ModelRunner(_config(family_dirs["phi3"], num_blocks=330), family_dirs["phi3"])
    plan = runner.model.decode_plan
    lens = [5, 12, 25] + [3 + 7 * i % 30 for i in range(29)]
    row_counts = (1, 3, 8, 32)
    tables = [list(range(1 + 10 * i, 11 + 10 * i)) for i in range(len(lens))]
    for i, n in enumerate(lens):
        runner.execute([SeqInput(list(range(10 + i, 10 + i + n)), 0, tables[i])])
    caches = [(k.clone(), v.clone()) for k, v in runner.kv_caches]
    seen = {}
    real_run = plan.run

    def capture(*args):
        seen["args"] = args
        return real_run(*args)

    plan.run = capture
    before = torch.get_num_threads()
    try:
        results = []
        for threads in (1, 2, 2):
            torch.set_num_threads(threads)
            runner.kv_caches[:] = [(k.clone(), v.clone()) for k, v in caches]
            for rows in row_counts:  # one sequence alone, then 3, 8 and 32
                seqs = [SeqInput([7 + i], n, tables[i]) for i, n in enumerate(lens[:rows])]
                runner.step_rows.set_step(runner.prepare(seqs)[2].num_decode)
                logits = runner.execute(seqs)
                results.append((logits, [torch.cat([k, v]) for k, v in runner.kv_caches]))
            if threads == 2 and len(results) == 2 * len(row_counts):
                args, residual, positions, rope, kv, meta, eps = seen["args"]
                bad = dataclasses.replace(meta, slot_mapping=meta.slot_mapping + 10**6)
                with pytest.raises(RuntimeError, match="slot out of range"):
                    real_run(args, residual.clone(), positions, rope, kv, bad, eps)
    finally:
        torch.set_num_threads(before)
    assert len(results) == 3 * len(row_counts)  # each row count on 1 thread, then twice on 2
    for i in range(len(row_counts), len(results)):
        ref_logits, ref_kv = results[i % len(row_counts)]
        assert torch.equal(results[i][0], ref_logits)
        assert all(torch.equal(a, b) for a, b in zip(results[i][1], ref_kv, strict=True))


def _gathered_attention(q, kc, vc, tables, lens, scale, window):
    """The reference: each sequence's keys gathered through its table, masked to the window."""
    out = torch.empty_like(q)
    group = q.shape[1] // kc.shape[2]
    for b, n in enumerate(lens.tolist()):
        k = kc[tables[b]].flatten(0, 1)[:n].repeat_interleave(group, 1)  # [n, H, D]
        v = vc[tables[b]].flatten(0, 1)[:n].repeat_interleave(group, 1)
        scores = torch.einsum("hd,nhd->hn", q[b].float(), k.float()) * scale
        if window:
            scores[:, : max(0, n - window)] = float("-inf")
        out[b] = torch.einsum("hn,nhd->hd", scores.softmax(-1), v.float()).to(q.dtype)
    return out


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("head_dim,heads,kv_heads", [(64, 8, 2), (256, 4, 1), (40, 6, 3)])
def test_decode_attention_window_reads_only_the_last_keys(isa, head_dim, heads, kv_heads):
    torch.manual_seed(0)
    bs, blocks = 4, 40
    kc = torch.randn(blocks, bs, kv_heads, head_dim)
    vc = torch.randn(blocks, bs, kv_heads, head_dim)
    lens = torch.tensor([1, 7, 8, 9, 30])
    tables = torch.stack([torch.randperm(blocks - 1)[:8] for _ in lens])
    q = torch.randn(len(lens), heads, head_dim)
    ops = torch.ops.zeroserve
    for window in (0, 1, 5, 8, 64):
        got = ops.paged_decode_attention(q, kc, vc, tables, lens, 0.3, isa, window)
        ref = _gathered_attention(q, kc, vc, tables, lens, 0.3, window)
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    # blocks wholly before the window are never read: an out-of-range id there is fine,
    # one inside the window is refused
    t = tables.clone()
    t[4, 0] = 10_000  # sequence of 30 tokens, window 8: keys 22..29, blocks 5..7
    ref = ops.paged_decode_attention(q, kc, vc, tables, lens, 0.3, isa, 8)
    assert torch.equal(ops.paged_decode_attention(q, kc, vc, t, lens, 0.3, isa, 8), ref)
    t[4, 6] = 10_000
    with pytest.raises(RuntimeError, match="block id"):
        ops.paged_decode_attention(q, kc, vc, t, lens, 0.3, isa, 8)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gelu_tanh_mul_equals_torch(isa, dtype):
    torch.manual_seed(1)
    x = (torch.randn(5, 2 * 333) * 4).to(dtype)
    x[0, :8] = torch.tensor([0.0, -0.0, 1e-8, -1e-8, 30.0, -30.0, 100.0, -100.0])
    gate, up = x.float().chunk(2, -1)
    ref = (F.gelu(gate, approximate="tanh").to(dtype).float() * up).to(dtype)
    got = torch.ops.zeroserve.gelu_tanh_mul(x, isa)
    rtol, atol = (1e-5, 1e-6) if dtype == torch.float32 else (1e-2, 1e-2)
    torch.testing.assert_close(got, ref, rtol=rtol, atol=atol)


@pytest.mark.parametrize("isa", ISAS)
def test_head_norm_norms_q_and_k_heads_in_place_and_leaves_v(isa):
    torch.manual_seed(2)
    t, heads, kv_heads, d = 3, 4, 2, 32
    qkv = torch.randn(t, (heads + 2 * kv_heads) * d)
    qw, kw = torch.randn(d), torch.randn(d)
    before = qkv.clone()
    torch.ops.zeroserve.head_norm_(qkv, qw, kw, heads, kv_heads, 1e-6, isa)

    def norm(x, w):
        return w * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)

    q, k, v = before.split([heads * d, kv_heads * d, kv_heads * d], 1)
    ref = torch.cat(
        [
            norm(q.view(t, heads, d), qw).view(t, -1),
            norm(k.view(t, kv_heads, d), kw).view(t, -1),
            v,
        ],
        1,
    )
    torch.testing.assert_close(qkv, ref, rtol=1e-5, atol=1e-5)
    assert torch.equal(qkv[:, (heads + kv_heads) * d :], v)
    with pytest.raises(RuntimeError, match="head_norm_"):
        torch.ops.zeroserve.head_norm_(qkv[:, 1:], qw, kw, heads, kv_heads, 1e-6, isa)
