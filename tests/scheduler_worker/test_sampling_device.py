"""Sampler.sample: the step's tokens and logprobs left on the device (DeviceSample), with no
host sync on CUDA, and the same results as Sampler.__call__ on a CPU."""

from __future__ import annotations

import contextlib

import pytest
import torch

from common.sampling_params import SamplingParams
from scheduler_worker import sampling, top_p
from scheduler_worker.sampling import DeviceSample, Sampler, SamplingRow

EOS, STOP = 2, 5
VOCAB = 1000
BANNED = 77
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

# every kind of row, by name: (sampling params, prompt, output, grammar mask?)
KINDS: dict[str, tuple[dict, list[int], list[int], bool]] = {
    "greedy": (dict(temperature=0.0), [], [], False),
    "greedy_penalized": (dict(temperature=0.0, repetition_penalty=1.5), [1, 3], [4], False),
    "temperature": (dict(temperature=0.7), [], [], False),
    "top_k": (dict(top_k=5), [], [], False),
    "top_p": (dict(top_p=0.8, temperature=1.3), [], [], False),
    "min_p": (dict(min_p=0.1), [], [], False),
    "penalties": (
        dict(repetition_penalty=1.2, presence_penalty=0.5, frequency_penalty=0.3),
        [7, 8],
        [8, 9, 9, VOCAB + 3],  # an id past the vocabulary: ignored
        False,
    ),
    "min_tokens": (dict(min_tokens=4, stop_token_ids=[STOP], temperature=0.0), [], [1], False),
    "seeded": (dict(seed=11, top_k=50, top_p=0.9), [], [], False),
    "seeded_2": (dict(seed=-3, min_p=0.05, temperature=0.5), [], [], False),
    "logprobs": (dict(logprobs=4, temperature=0.9), [], [], False),
    "logprobs_greedy": (dict(logprobs=0, temperature=0.0), [], [], False),
    "grammar": (dict(temperature=1.0, seed=5), [], [], True),
    "grammar_greedy": (dict(temperature=0.0, logprobs=2), [], [], True),
    "everything": (
        dict(top_k=40, top_p=0.9, min_p=0.02, temperature=0.8, logprobs=3, seed=2),
        [3],
        [3, 3],
        False,
    ),
    # logit_bias: +100 forces its token; -100 bans BANNED, the row's argmax (see _logits)
    "bias_greedy": (dict(temperature=0.0, logit_bias={123: 100.0, 7: -100.0}), [], [], False),
    "bias_sampled": (dict(temperature=0.8, seed=4, logit_bias={40: 100, 9: -3.5}), [], [], False),
    "bias_banned": (dict(temperature=0.0, logprobs=1, logit_bias={BANNED: -100}), [], [], False),
}
NAMES = list(KINDS)


def _words(seed: int) -> torch.Tensor:
    """A grammar's packed bitmask (CPU int32, as scheduler_worker.structured gives it)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-(2**31), 2**31 - 1, (-(-VOCAB // 32),), dtype=torch.int32, generator=g)


def _allowed(words: torch.Tensor) -> torch.Tensor:
    bits = (words[:, None] >> torch.arange(32, dtype=torch.int32)) & 1
    return bits.flatten()[:VOCAB].bool()


def _rows(device: str, names: list[str] = NAMES) -> list[SamplingRow]:
    """Fresh rows of the named kinds."""
    rows = []
    for i, name in enumerate(names):
        kw, prompt, output, masked = KINDS[name]
        params = SamplingParams(**kw)
        rows.append(
            SamplingRow(params, prompt, output, token_bitmask=_words(i) if masked else None)
        )
    return rows


def _logits(device: str, dtype: torch.dtype = torch.float32, pad: int = 24) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(len(NAMES), VOCAB + pad, generator=g) * 3
    logits[NAMES.index("bias_banned"), BANNED] = 30.0
    return logits.to(device=device, dtype=dtype)


def _lists(out: sampling.SamplerOutput) -> tuple:
    return out.token_ids, [None if lp is None else lp._asdict() for lp in out.logprobs]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sample_then_result_is_what_call_gives_on_cpu(dtype):
    logits = _logits("cpu", dtype)
    sampler = Sampler(VOCAB, [EOS])
    outs = []
    for run in range(3):
        torch.manual_seed(1)  # the unseeded rows' draws
        rows = _rows("cpu")
        if run == 0:
            outs.append(_lists(sampler(logits, rows)))
            continue
        sample = sampler.sample(logits, rows)
        assert isinstance(sample, DeviceSample) and sample.token_ids.dtype == torch.long
        want = [i for i, n in enumerate(NAMES) if KINDS[n][0].get("logprobs") is not None]
        assert sample.logprob_rows == want and sample.sampled_logprobs is not None
        assert sample.top_ids is not None and sample.top_ids.shape == (len(want), 4)
        outs.append(_lists(sample.start_copy().result() if run == 1 else sample.result()))
    assert outs[0] == outs[1] == outs[2]
    assert len(outs[0][1][NAMES.index("logprobs")]["top_ids"]) == 4  # logprobs came back


def test_the_device_path_picks_what_the_cpu_path_picks(monkeypatch):
    """The GPU's algorithms (top-p's radix search on every row, the +inf/NaN repair on
    every row), run on a CPU: the same tokens and logprobs as the CPU's own, on rows of
    every kind, on rows holding +inf and NaN, and on top-p nuclei past TOP_P_WINDOWS."""
    logits = _logits("cpu")
    logits[NAMES.index("temperature"), 17] = float("inf")
    logits[NAMES.index("top_p"), 3] = float("nan")
    wide = torch.randn(4, 6000, generator=torch.Generator().manual_seed(2)) * 0.3  # > SORT_VOCAB
    wide_params = [SamplingParams(top_p=p) for p in (0.5, 0.9, 0.99, 0.2)]

    def run() -> list:
        torch.manual_seed(3)
        out = [_lists(Sampler(VOCAB, [EOS])(logits, _rows("cpu")))]
        probs = sampling.sampling_probs(wide, wide_params)
        return out + [probs]

    cpu = run()
    monkeypatch.setattr(sampling, "enqueues_work", lambda device: True)
    dev = run()
    assert cpu[0] == dev[0]
    tokens, lps = cpu[0]
    assert tokens[NAMES.index("bias_greedy")] == 123 and tokens[NAMES.index("bias_sampled")] == 40
    i = NAMES.index("bias_banned")  # banned, yet the top logprob: the model's own
    assert tokens[i] != BANNED and lps[i]["top_ids"] == [BANNED]
    assert torch.equal(cpu[1], dev[1])
    assert (cpu[1] > 0).sum(-1).max() > max(top_p.TOP_P_WINDOWS)  # the radix search's case


def test_sample_does_not_modify_its_input():
    logits = _logits("cpu")
    before = logits.clone()
    Sampler(VOCAB, [EOS]).sample(logits, _rows("cpu")).result()
    assert torch.equal(logits, before)
    greedy = [SamplingRow(SamplingParams(temperature=0.0), [], [], token_bitmask=_words(0))]
    Sampler(VOCAB, [EOS]).sample(logits[:1], greedy).result()
    assert torch.equal(logits, before)


@contextlib.contextmanager
def _no_host_sync():
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")  # any synchronizing call raises
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode(0)


def _draw_rows(draw: str):
    """The GPU backend's draw op (draw "triton": backends/triton_sample.py, keyed, as
    CudaBackend declares it) or None (the torch path)."""
    if draw == "torch":
        return None
    from scheduler_worker.backends.base import DrawRows
    from scheduler_worker.backends.triton_sample import sample_rows_keyed

    return DrawRows(sample_rows_keyed, keyed=True, device="cuda")


@cuda
@pytest.mark.parametrize("draw", ["torch", "triton"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sample_on_cuda_never_waits_for_the_device(dtype, draw):
    logits = _logits("cuda", dtype)
    sampler = Sampler(VOCAB, [EOS], draw_rows=_draw_rows(draw))
    plain_rows = [  # one argmax (the fast path), one through a grammar mask
        SamplingRow(SamplingParams(temperature=0.0), [], []),
        SamplingRow(SamplingParams(temperature=0.0), [], [], token_bitmask=_words(1)),
    ]
    sampler.sample(logits, _rows("cuda")).result()  # lazy initializations, outside the check
    sampler.sample(logits[:2], plain_rows).result()
    rows = _rows("cuda")
    with _no_host_sync():
        sample = sampler.sample(logits, rows).start_copy()
        fast = sampler.sample(logits[:2].clone(), plain_rows, writable=True).start_copy()
    assert sample.token_ids.is_cuda
    out, fast_out = sample.result(), fast.result()

    ref = logits[:, :VOCAB].float().cpu()
    tokens = out.token_ids
    assert all(0 <= t < VOCAB for t in tokens)
    argmax = ref.argmax(-1).tolist()
    for name in ("greedy", "logprobs_greedy"):
        assert tokens[NAMES.index(name)] == argmax[NAMES.index(name)], name
    i = NAMES.index("top_k")
    assert tokens[i] in ref[i].topk(5).indices.tolist()
    assert tokens[NAMES.index("min_tokens")] not in (EOS, STOP)
    assert tokens[NAMES.index("bias_greedy")] == 123 and tokens[NAMES.index("bias_sampled")] == 40
    i = NAMES.index("bias_banned")
    assert argmax[i] == BANNED and tokens[i] == ref[i].topk(2).indices[1].item()
    for name in ("grammar", "grammar_greedy"):
        i = NAMES.index(name)
        assert _allowed(_words(i))[tokens[i]], name
    i = NAMES.index("grammar_greedy")
    assert tokens[i] == ref[i].masked_fill(~_allowed(_words(i)), float("-inf")).argmax().item()
    # greedy with penalties: what the CPU's sampler picks
    cpu = Sampler(VOCAB, [EOS])(logits.cpu(), _rows("cpu"))
    i = NAMES.index("greedy_penalized")
    assert tokens[i] == cpu.token_ids[i]
    lp_ref = ref.log_softmax(-1)
    for i, name in enumerate(NAMES):
        lp = out.logprobs[i]
        n = KINDS[name][0].get("logprobs")
        assert (lp is None) == (n is None), name
        if lp is not None:
            assert lp.token_id == tokens[i] and len(lp.top_ids) == n
            assert lp.logprob == pytest.approx(lp_ref[i, tokens[i]].item(), abs=1e-4)
            assert lp.top_logprobs == pytest.approx(lp_ref[i, lp.top_ids].tolist(), abs=1e-4)
            assert lp.top_logprobs == pytest.approx(lp_ref[i].topk(n).values.tolist(), abs=1e-4)
    masked = ref[1].masked_fill(~_allowed(_words(1)), float("-inf"))
    assert fast_out.token_ids == [argmax[0], masked.argmax().item()]
    assert fast_out.logprobs == [None, None]


@cuda
@pytest.mark.parametrize("draw", ["torch", "triton"])
def test_seeded_rows_on_cuda_repeat_and_match_the_cpu(draw):
    logits = torch.zeros(len(NAMES), VOCAB, device="cuda")  # flat: the seed decides
    sampler = Sampler(VOCAB, [EOS], draw_rows=_draw_rows(draw))
    seeded = [i for i, r in enumerate(_rows("cuda")) if r.params.seed is not None]
    runs = []
    for unseeded_seed in (1, 2):
        torch.cuda.manual_seed(unseeded_seed)  # the other rows draw differently
        runs.append(sampler.sample(logits, _rows("cuda")).result().token_ids)
    on_cpu = Sampler(VOCAB, [EOS]).sample(logits.cpu(), _rows("cpu")).result().token_ids
    assert [on_cpu[i] for i in seeded] == [runs[0][i] for i in seeded]  # one hash, any device
    assert [runs[0][i] for i in seeded] == [runs[1][i] for i in seeded]
    assert len({runs[0][i] for i in seeded}) > 1  # the seeds differ, so do their draws
    assert runs[0] != runs[1]  # the unseeded rows did move
