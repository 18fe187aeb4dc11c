"""The CUDA backend's code on the CPU: its op set (Triton kernels in the interpreter), its
varlen step inputs and its decode graphs (stand-ins) run a real model, against the CPU
engine's float32 logits. What only a GPU has (graph capture, memory sizing, the device
copies) is tested by test_cuda_backend.py there."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton")

from common.config import CacheConfig, EngineConfig, ModelConfig  # noqa: E402
from scheduler_worker.backends.cuda import CudaBackend  # noqa: E402
from scheduler_worker.backends.graphs import StandInGraph  # noqa: E402
from scheduler_worker.backends.triton_attention import table_width  # noqa: E402
from scheduler_worker.model_runner import ModelRunner, SeqInput  # noqa: E402
from tests.conftest import save_tiny_llama  # noqa: E402
from tests.scheduler_worker.family_models import FAMILIES, save_family  # noqa: E402

if torch.cuda.is_available():
    pytest.skip("the GPU runs test_cuda_backend.py", allow_module_level=True)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    """A tiny random Llama with head_dim 64: 6 query heads over 2 KV heads."""
    return save_tiny_llama(
        tmp_path_factory.mktemp("triton_tiny") / "llama",
        vocab_size=256, hidden_size=384, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=256,
        initializer_range=0.05, eos_token_id=2, tie_word_embeddings=True,
    )  # fmt: skip


def cpu_runner(model_dir: Path, dtype: str = "float32") -> ModelRunner:
    cfg = EngineConfig(
        model=ModelConfig(model=str(model_dir), dtype=dtype, kernels="torch"),
        cache=CacheConfig(block_size=16, num_blocks=24, kv_cache_dtype=dtype),
    )
    return ModelRunner(cfg, model_dir)


def triton_runner(
    model_dir: Path, dtype: str = "float32", max_num_batched_tokens: int = 256
) -> ModelRunner:
    """A CPU runner whose backend is the CUDA backend on the CPU (interpreted kernels)."""
    runner = cpu_runner(model_dir, dtype)
    args = runner.model.args
    backend = CudaBackend(
        getattr(torch, dtype), 16, num_kv_heads=args.num_kv_heads, max_num_seqs=4,
        max_num_batched_tokens=max_num_batched_tokens, max_model_len=256,
        gpu_memory_utilization=0.9, enforce_eager=False, head_dim=args.head_dim,
        device=torch.device("cpu"),
    )  # fmt: skip
    backend.scratch_block = runner.num_blocks
    runner.use_ops(backend.ops)
    runner.backend = backend
    return runner


PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [3, 4], list(range(20, 60)), [7] * 33]
TABLES = [[0, 1, 2, 3], [4, 5], [6, 7, 8, 9], [10, 11, 12, 13]]


def run_steps(runner: ModelRunner, decode_steps: int = 2) -> list[torch.Tensor]:
    """Prefill PROMPTS (the third in two chunks, the second over a cached prefix), then
    decode steps of all four: each step's logits."""
    with torch.inference_mode():
        first = [SeqInput(p, 0, t) for p, t in zip(PROMPTS, TABLES)]
        first[2] = SeqInput(PROMPTS[2][:24], 0, TABLES[2], sample=False)
        out = [runner.execute(first).clone()]
        out.append(runner.execute([SeqInput(PROMPTS[2][24:], 24, TABLES[2])]).clone())
        for k in range(decode_steps):
            seqs = [SeqInput([100 + k], len(p) + k, t) for p, t in zip(PROMPTS, TABLES)]
            out.append(runner.execute(seqs).clone())
    return out


def test_triton_backend_eager_steps_equal_the_cpu_engine(model_dir):
    want = run_steps(cpu_runner(model_dir))
    got = run_steps(triton_runner(model_dir))
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


def test_triton_backend_graph_replays_equal_the_cpu_engine(model_dir):
    """Decode steps through the backend's own capture() (stand-in graphs): 4 rows, then 3
    rows padded to the bucket of 4, with a window of splits over the context."""
    want = run_steps(cpu_runner(model_dir), decode_steps=3)
    runner = triton_runner(model_dir)
    backend = runner.backend
    assert isinstance(backend, CudaBackend)

    def stand_in(fn):
        g = StandInGraph(fn)
        return g, g.output

    graphs = backend.capture(runner.model, runner.kv_caches, stand_in)
    assert graphs is not None and sorted(graphs.graphs) == [1, 2, 4]
    assert backend.splits(1) > 1  # the one-row graph splits each context
    # the steps with prompt tokens replay mixed-step graphs (within 256 batched tokens)
    assert backend.mixed is not None and sorted(backend.mixed.graphs) == [64, 128, 256]
    # every graph of a kind writes one logits buffer (graphs.SharedLogits)
    assert len({o.data_ptr() for o in graphs.outputs.values()}) == 1
    assert len({o.data_ptr() for o in backend.mixed.outputs.values()}) == 1
    replays = {t: 0 for t in backend.mixed.graphs}
    for t, g in backend.mixed.graphs.items():
        g.replay = lambda g=g, t=t, r=g.replay: (replays.__setitem__(t, replays[t] + 1), r())
    got = run_steps(runner, decode_steps=2)
    # the first step's 66 tokens (4 sequences, one a chunk that samples nothing) and the
    # second's 16-token chunk over its cached prefix: both from graphs
    assert replays == {64: 1, 128: 1, 256: 0}
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    # a third decode step of three rows only: padded to the 4-row graph
    three = [SeqInput([102], len(p) + 2, t) for p, t in zip(PROMPTS[:3], TABLES[:3])]
    with torch.inference_mode():
        rows = runner.execute(three)
    torch.testing.assert_close(rows, want[-1][:3], rtol=1e-4, atol=1e-4)


def test_mixed_step_graph_reads_a_placeholder_token_and_equals_the_cpu_engine(model_dir):
    """A new prompt beside a decode whose token is the step in flight's (overlapped
    scheduling): the mixed-step graph reads it on the device, as the CPU engine computes
    the same step with the token known."""
    cpu, runner = cpu_runner(model_dir), triton_runner(model_dir, max_num_batched_tokens=64)
    backend = runner.backend
    assert isinstance(backend, CudaBackend)
    backend.capture(runner.model, runner.kv_caches, lambda fn: (g := StandInGraph(fn), g.output))
    for r in (cpu, runner):
        run_steps(r, decode_steps=1)
    new = SeqInput(list(range(30, 51)), 0, [14, 15])
    with torch.inference_mode():
        want = cpu.execute([SeqInput([101], len(PROMPTS[0]) + 1, TABLES[0]), new])
        backend.prev_tokens = torch.tensor([3, 101, 5])
        got = runner.execute([SeqInput([-1], len(PROMPTS[0]) + 1, TABLES[0], prev_row=1), new])
    assert backend.mixed is not None and backend.mixed.fits([new])
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_running_out_of_memory_while_capturing_keeps_the_sizes_captured(model_dir, caplog):
    """Graphs are captured largest first: out of memory at the third size keeps the two
    captured (4 and 2 rows) and says so; at the first, none (every step eager). The mixed
    steps' graphs (128, 64 tokens, after the 3 decode sizes) the same way."""
    import logging

    runner = triton_runner(model_dir, max_num_batched_tokens=128)
    backend = runner.backend
    assert isinstance(backend, CudaBackend)
    for fail_at, kept in ((2, [2, 4]), (4, [1, 2, 4]), (0, None)):
        calls = []
        caplog.clear()

        def flaky(fn, fail_at=fail_at, calls=calls):
            if len(calls) == fail_at:
                raise torch.OutOfMemoryError("CUDA out of memory (a test)")
            calls.append(1)
            g = StandInGraph(fn)
            return g, g.output

        backend.graphs = None
        with caplog.at_level(logging.WARNING):
            graphs = backend.capture(runner.model, runner.kv_caches, flaky)
        if kept is None:
            assert graphs is None and backend.graphs is None
            assert "every step runs eagerly" in caplog.text
        elif fail_at == 2:
            assert graphs is not None and sorted(graphs.graphs) == kept
            assert "kept 2 sizes up to 4 rows" in caplog.text and backend.mixed is None
        else:  # every decode size, then the largest mixed size only
            assert graphs is not None and sorted(graphs.graphs) == kept
            assert backend.mixed is not None and sorted(backend.mixed.graphs) == [128]
            assert "mixed-step graphs: kept 128;" in caplog.text
            assert "decode graphs" not in caplog.text
    # without graphs a decode step runs eagerly, and right: over the prompts' K/V from the
    # torch engine (the eager prefill is test_triton_backend_eager_steps_equal_the_cpu_engine's)
    cpu = cpu_runner(model_dir)
    run_steps(cpu, decode_steps=0)
    for (k, v), (k_cpu, v_cpu) in zip(runner.kv_caches, cpu.kv_caches, strict=True):
        k.copy_(k_cpu)
        v.copy_(v_cpu)
    seqs = [SeqInput([100], len(p), t) for p, t in zip(PROMPTS, TABLES)]
    with torch.inference_mode():
        want = cpu.execute(seqs)
        got = runner.execute(seqs)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_every_steps_block_tables_are_a_multiple_of_16_wide(model_dir):
    """The tables' row stride is an int argument of the attention kernels, which Triton
    specializes on divisibility by 16: eager steps of any width and the captured graphs
    all get a multiple of 16, so no step compiles a kernel variant start-up did not."""
    assert [table_width(b) for b in (0, 1, 15, 16, 17, 33)] == [16, 16, 16, 16, 32, 48]
    runner = triton_runner(model_dir, max_num_batched_tokens=64)
    backend = runner.backend
    for seqs in (
        [SeqInput([5] * 20, 0, [0, 1])],  # a prompt of 2 blocks
        [SeqInput([5], 270, list(range(17))), SeqInput([6] * 3, 0, [20])],  # 17 blocks
    ):
        _, _, meta = backend.prepare(seqs)
        want = table_width(max(len(s.block_table) for s in seqs))
        assert meta.block_tables.shape == (len(seqs), want)
        assert meta.block_tables.stride(0) % 16 == 0
        # past a sequence's own blocks: the scratch block, which no query reads
        assert meta.block_tables[0, len(seqs[0].block_table) :].eq(backend.scratch_block).all()
    graphs = backend.capture(
        runner.model, runner.kv_caches, lambda fn: (g := StandInGraph(fn), g.output)
    )
    assert graphs is not None and graphs.inputs.max_blocks % 16 == 0


def test_bfloat16_steps_keep_a_float32_residual_in_eager_steps_and_graphs(model_dir):
    """In bfloat16 the CUDA backend's op set keeps the residual stream in float32; its
    eager and replayed steps give the CPU reference's logits with the same residual, to
    bf16's rounding (the attentions round at other points, and the interpreter truncates
    to bf16 where a GPU rounds to nearest: here up to 0.07 against logits of +-3)."""
    runner = triton_runner(model_dir, "bfloat16", max_num_batched_tokens=64)
    backend = runner.backend
    assert isinstance(backend, CudaBackend) and backend.ops.residual_dtype == torch.float32
    reference = cpu_runner(model_dir, "bfloat16")
    wide = copy.copy(reference.backend.ops)
    wide.residual_dtype = torch.float32
    reference.use_ops(wide)
    want = run_steps(reference, decode_steps=2)
    eager = run_steps(triton_runner(model_dir, "bfloat16"), decode_steps=2)
    backend.capture(runner.model, runner.kv_caches, lambda fn: (g := StandInGraph(fn), g.output))
    assert backend.graphs is not None and backend.mixed is not None
    replayed = run_steps(runner, decode_steps=2)
    for got in (eager, replayed):
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, rtol=0, atol=0.1)
            assert (a - b).abs().mean() < 0.02


@pytest.fixture(scope="module")
def gemma3_dir(tmp_path_factory) -> Path:
    return save_family("gemma3", tmp_path_factory.mktemp("triton_gemma3") / "gemma3")


def test_gemma3_through_the_triton_op_set_equals_the_cpu_engine(gemma3_dir):
    """Gemma 3 on the GPU backend's code: eager steps and graph replays."""
    want = run_steps(cpu_runner(gemma3_dir), decode_steps=2)
    runner = triton_runner(gemma3_dir, max_num_batched_tokens=64)
    for got in (run_steps(triton_runner(gemma3_dir), decode_steps=2), None):
        if got is None:  # the same steps again, from the backend's (stand-in) graphs
            backend = runner.backend
            assert isinstance(backend, CudaBackend)
            backend.capture(
                runner.model, runner.kv_caches, lambda fn: (g := StandInGraph(fn), g.output)
            )
            assert backend.graphs is not None and backend.mixed is not None
            got = run_steps(runner, decode_steps=2)
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("family", sorted(set(FAMILIES) - {"gemma3"}))
def test_every_family_through_the_triton_op_set_equals_the_cpu_engine(family, tmp_path):
    """Each family's layers on the GPU backend's op set (eager steps, float32): a family
    whose layers hand an op a shape its kernel does not take fails here, not on a GPU."""
    model_dir = save_family(family, tmp_path / family)
    want = run_steps(cpu_runner(model_dir))
    got = run_steps(triton_runner(model_dir))
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


def test_decode_graph_logprobs_equal_the_eager_steps(model_dir):
    """The sampler's logprobs (the chosen token's and the top 5) from decode steps replayed
    in the backend's graphs against the same steps run eagerly just before (each writes the
    same K/V slots): equal to float32 rounding. Contexts of 130 and 150 keys split in two
    (128-key tiles, the graphs' cap of 2), the 40-key one does not; three rows replay the
    4-row graph with a padding row."""
    from common.sampling_params import SamplingParams
    from scheduler_worker.logits_processors import SamplingRow
    from scheduler_worker.sampling import Sampler

    prompts = [list(range(3, 153)), [9] * 40, [(7 * i) % 250 + 3 for i in range(130)]]
    tables = [list(range(10)), [10, 11, 12], list(range(13, 22))]
    params = [
        SamplingParams(max_tokens=8, temperature=0.0, logprobs=5),
        SamplingParams(max_tokens=8, temperature=0.0, logprobs=5),
        SamplingParams(max_tokens=8, temperature=0.8, top_p=0.9, seed=11, logprobs=5),
    ]
    runner = triton_runner(model_dir, max_num_batched_tokens=64)  # one mixed graph
    backend = runner.backend
    assert isinstance(backend, CudaBackend)
    graphs = backend.capture(
        runner.model, runner.kv_caches, lambda fn: (g := StandInGraph(fn), g.output)
    )
    assert graphs is not None and backend.splits(4) == 2
    replays = []
    g4 = graphs.graphs[4]
    g4.replay = lambda r=g4.replay: (replays.append(4), r())[1]  # type: ignore[method-assign]
    sampler = Sampler(256, [2])
    outputs: list[list[int]] = [[], [], []]
    with torch.inference_mode():
        # the prompts' K/V from the torch engine (the interpreter's prefill takes ~10 s)
        cpu = cpu_runner(model_dir)
        cpu.execute([SeqInput(p, 0, t) for p, t in zip(prompts, tables)])
        for (k, v), (k_cpu, v_cpu) in zip(runner.kv_caches, cpu.kv_caches):
            k.copy_(k_cpu)
            v.copy_(v_cpu)
        tokens = [5, 6, 7]
        for step in range(2):
            seqs = [SeqInput([tok], len(p) + step, t) for tok, p, t in zip(tokens, prompts, tables)]
            got = {}
            for name in ("eager", "graph"):
                backend.graphs = graphs if name == "graph" else None
                rows = [SamplingRow(*r) for r in zip(params, prompts, outputs)]
                got[name] = sampler(runner.execute(seqs).clone(), rows)
            want, replayed = got["eager"], got["graph"]
            assert replayed.token_ids == want.token_ids
            for a, b in zip(replayed.logprobs, want.logprobs):
                assert a is not None and b is not None and a.top_ids == b.top_ids
                assert a.logprob == pytest.approx(b.logprob, abs=1e-5)
                assert a.top_logprobs == pytest.approx(b.top_logprobs, abs=1e-5)
            tokens = want.token_ids
            for out, tok in zip(outputs, tokens):
                out.append(tok)
    assert replays == [4, 4]


def test_a_verify_step_replays_the_decode_graph_of_its_row_count(model_dir):
    """A drafted row's [last, d1, d2] as three decode rows (spec/verify_rows.py) through
    the decode graphs (stand-ins): the 4-row graph replays, no eager step, and each
    position's logits equal the CPU engine's plain decode step there."""
    cpu = cpu_runner(model_dir)
    runner = triton_runner(model_dir, max_num_batched_tokens=64)  # one mixed graph
    backend = runner.backend
    assert isinstance(backend, CudaBackend) and backend.verify_as_decode_rows

    def stand_in(fn):
        g = StandInGraph(fn)
        return g, g.output

    graphs = backend.capture(runner.model, runner.kv_caches, stand_in)
    assert graphs is not None
    prompt, table, drafts = PROMPTS[0], TABLES[0], [40, 41]
    chain = [100, *drafts]  # the row's last token, then its drafts
    want = []
    with torch.inference_mode():
        cpu.execute([SeqInput(prompt, 0, table)])
        for j, t in enumerate(chain):  # one plain decode step a position
            want.append(cpu.execute([SeqInput([t], len(prompt) + j, table)])[0].clone())
        runner.execute([SeqInput(prompt, 0, table)])
        replays = dict.fromkeys(graphs.graphs, 0)
        for n, g in graphs.graphs.items():
            g.replay = lambda g=g, n=n, r=g.replay: (replays.__setitem__(n, replays[n] + 1), r())
        row = SeqInput(chain, len(prompt), table, prompt_logits=2, verify=True)
        logits, extra = runner.execute_with_prompt_logits([row])
    assert replays == {1: 0, 2: 0, 4: 1}  # three rows: the 4-row bucket, once
    got = torch.cat([extra[0], logits])
    torch.testing.assert_close(got, torch.stack(want), rtol=1e-4, atol=1e-4)
