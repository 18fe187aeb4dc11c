from __future__ import annotations

import functools
import math

import pytest
import torch

from common.sampling_params import SamplingParams
from scheduler_worker import kernels, penalties, sampling
from scheduler_worker.logits_processors import apply_logit_bias
from scheduler_worker.sampling import Sampler, SamplingRow, sampling_probs

EOS = 2


@pytest.fixture(autouse=True, params=["torch", "kernels"])
def sampler_path(request, monkeypatch):
    """Each test on the torch path and on the C++ kernels' (draws.kernel_sample)."""
    if request.param == "kernels":
        if not kernels.load():
            pytest.skip("the C++ kernels are not built here")
        isa = kernels.isa_index(kernels.best_isa())
        init = functools.partialmethod(Sampler.__init__, kernel_isa=isa)
        monkeypatch.setitem(globals(), "Sampler", type("KSampler", (Sampler,), {"__init__": init}))


def _row(
    output: list[int] | None = None, prompt: list[int] | None = None, seed: int | None = None, **kw
) -> SamplingRow:
    params = SamplingParams(seed=seed, **kw)
    return SamplingRow(params, prompt or [], output or [])


def _counts(tokens: list[int], vocab: int) -> list[int]:
    return torch.bincount(torch.tensor(tokens), minlength=vocab).tolist()


# 5 tokens with known probabilities
PROBS = [0.4, 0.3, 0.15, 0.1, 0.05]
LOGITS = torch.tensor(PROBS).log()


def _draw(n: int = 2000, **kw) -> list[int]:
    logits = LOGITS.expand(n, -1).clone()
    return Sampler(5, [])(logits, [_row(**kw) for _ in range(n)]).token_ids


def test_greedy_is_argmax_and_takes_the_fast_path(monkeypatch):
    def boom(*args, **kwargs):
        raise AssertionError("greedy batch left the fast path")

    monkeypatch.setattr(sampling, "apply_penalties", boom)
    monkeypatch.setattr(sampling, "mask_stop_tokens", boom)
    logits = torch.randn(8, 100, generator=torch.Generator().manual_seed(0))
    rows = [_row(temperature=0.0) for _ in range(4)] + [_row(top_k=1, temperature=0.8)] * 4
    out = Sampler(100, [EOS])(logits, rows)
    assert out.token_ids == logits.argmax(-1).tolist() and out.logprobs == [None] * 8
    out = Sampler(100, [EOS])(logits.bfloat16(), rows)
    assert out.token_ids == logits.bfloat16().argmax(-1).tolist()


def test_greedy_tokens_pick_what_argmax_picks_on_ties_infinities_and_nan():
    """greedy_tokens (max's indices) against torch's argmax, the reference: the first of
    tied maxima, +inf over everything, a row masked to -inf but one token, NaN wherever
    it is, over vocabularies past a vector's width and at Gemma 3's size."""
    gen = torch.Generator().manual_seed(0)
    for vocab in (5, 100, 49152, 262144):
        x = torch.randint(-3, 3, (9, vocab), generator=gen).float()  # many tied maxima
        x[1] = float("-inf")
        x[1, vocab - 1] = 0.0
        x[2, vocab // 2] = float("inf")
        x[3, vocab // 3] = float("nan")
        x[4, :] = 7.0  # every token tied: the first
        for logits in (x, x.bfloat16()):
            got = sampling.greedy_tokens(logits)
            assert torch.equal(got, logits.argmax(dim=-1)), (vocab, logits.dtype)
        assert sampling.greedy_tokens(x)[4] == 0 and sampling.greedy_tokens(x)[1] == vocab - 1


def test_greedy_rows_in_a_mixed_batch_use_penalized_logits():
    logits = torch.tensor([[5.0, 4.0, 0.0, 0.0], [5.0, 4.0, 0.0, 0.0]])
    rows = [
        _row(temperature=0.0, output=[0], repetition_penalty=2.0),  # 5/2 < 4
        _row(temperature=1.0, top_k=1),
    ]
    assert Sampler(4, [])(logits, rows).token_ids == [1, 0]


def test_sampler_does_not_modify_its_input():
    logits = torch.randn(3, 10)
    before = logits.clone()
    rows = [
        _row(
            output=[1, 1], repetition_penalty=1.5, frequency_penalty=1.0, min_tokens=5, logprobs=2
        ),
        _row(seed=1, top_p=0.5),
        _row(temperature=0.0),
    ]
    Sampler(10, [EOS])(logits, rows)
    assert torch.equal(logits, before)
    rows = [_row(logprobs=3), _row(min_p=0.1, top_k=3, logprobs=1)] * 3  # all sampled, no copy
    out = Sampler(10, [EOS])(logits[:2].repeat(3, 1), rows)
    assert torch.equal(logits, before)
    lp = logits[:2].repeat(3, 1).log_softmax(-1)
    assert [t.logprob for t in out.logprobs] == pytest.approx(
        [lp[i, t].item() for i, t in enumerate(out.token_ids)], abs=1e-6
    )


def test_penalties_on_hand_computed_values():
    logits = torch.tensor([[2.0, -1.0, 0.5, -0.5, 3.0, 0.0]] * 4)
    rows = [
        # repetition over prompt + output: seen {0, 1, 3}; presence/frequency over output
        _row(
            prompt=[0, 1],
            output=[1, 3, 3],
            repetition_penalty=2.0,
            presence_penalty=0.5,
            frequency_penalty=0.25,
        ),
        _row(prompt=[0, 1], output=[1, 3, 3]),  # no penalty
        _row(prompt=[4], output=[0, 0, 0, 5, 99], frequency_penalty=-1.0),  # 99: not in vocab
        _row(prompt=[0, 4], output=[], repetition_penalty=0.5, presence_penalty=2.0),
    ]
    out = penalties.apply_penalties(logits, rows)
    expected = torch.tensor(
        [
            [2.0 / 2, -1.0 * 2 - 0.5 - 0.25, 0.5, -0.5 * 2 - 0.5 - 0.5, 3.0, 0.0],
            [2.0, -1.0, 0.5, -0.5, 3.0, 0.0],
            [2.0 + 3.0, -1.0, 0.5, -0.5, 3.0, 0.0 + 1.0],
            [2.0 / 0.5, -1.0, 0.5, -0.5, 3.0 / 0.5, 0.0],
        ]
    )
    torch.testing.assert_close(out, expected)
    assert torch.equal(logits[0], torch.tensor([2.0, -1.0, 0.5, -0.5, 3.0, 0.0]))  # not in place
    assert penalties.apply_penalties(logits, [_row()] * 4) is logits  # nothing to do: no copy


def test_min_tokens_masks_eos_and_stop_ids():
    logits = torch.tensor([[0.0, 0.0, 9.0, 0.0, 8.0, 1.0]])  # EOS (2), then stop id 4
    sampler = Sampler(6, [EOS])
    for temperature in (0.0, 1.0):
        for n in range(3):
            kw = dict(min_tokens=3, stop_token_ids=[4], temperature=temperature)
            for ignore_eos in (False, True):
                row = _row(output=[0] * n, ignore_eos=ignore_eos, **kw)
                tokens = sampler(logits.expand(200, -1), [row] * 200).token_ids
                assert EOS not in tokens and 4 not in tokens
        assert sampler(logits, [_row(output=[0] * 3, min_tokens=3, temperature=0.0)]).token_ids == [
            EOS
        ]


def test_logprobs_come_from_raw_logits():
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(4, 50, generator=gen) * 3
    rows = [
        _row(logprobs=5, temperature=0.7, repetition_penalty=1.3, output=[1, 2]),
        _row(logprobs=0, temperature=0.0),
        _row(),
        _row(logprobs=20, top_k=3, seed=3),
    ]
    out = Sampler(50, [EOS])(logits.bfloat16(), rows)
    raw_lp = logits.bfloat16().float().log_softmax(-1)
    assert out.logprobs[2] is None
    for i, n in ((0, 5), (1, 0), (3, 20)):
        lp = out.logprobs[i]
        assert lp.token_id == out.token_ids[i]
        assert lp.logprob == pytest.approx(raw_lp[i, lp.token_id].item(), abs=1e-5)
        top = raw_lp[i].topk(n) if n else None
        assert lp.top_ids == (top.indices.tolist() if n else [])
        assert lp.top_logprobs == pytest.approx(top.values.tolist() if n else [], abs=1e-5)


def test_logit_bias_bans_and_forces_tokens_in_only_its_rows():
    """-100 bans a row's argmax, +100 forces a token, in greedy and sampled rows alike;
    the rows without a bias draw what they draw without the biased rows' biases."""
    gen = torch.Generator().manual_seed(4)
    logits = torch.randn(6, 50, generator=gen) * 3
    top = logits.argmax(-1).tolist()
    forced = [(t + 17) % 50 for t in top]  # never the argmax
    bias_rows = {
        1: dict(temperature=0.0, logit_bias={top[1]: -100.0}),
        2: dict(temperature=0.0, logit_bias={forced[2]: 100}),
        3: dict(temperature=0.9, seed=8, logit_bias={forced[3]: 100.0}),
        4: dict(temperature=1.0, seed=9, logit_bias={top[4]: -100.0}, logprobs=2),
    }
    plain = {0: dict(temperature=0.0), 5: dict(temperature=1.2, seed=3)}

    def run(biased: bool) -> sampling.SamplerOutput:
        kws = {**plain, **bias_rows}
        if not biased:
            kws = {i: {k: v for k, v in kw.items() if k != "logit_bias"} for i, kw in kws.items()}
        return Sampler(50, [EOS])(logits, [_row(**kws[i]) for i in range(6)])

    out, unbiased = run(True), run(False)
    assert unbiased.token_ids[1] == top[1] and out.token_ids[1] != top[1]
    assert out.token_ids[1] == logits[1].topk(2).indices[1].item()  # the runner-up
    assert out.token_ids[2] == forced[2] and out.token_ids[3] == forced[3]
    assert out.token_ids[4] != top[4]
    assert [out.token_ids[i] for i in plain] == [unbiased.token_ids[i] for i in plain]
    assert out.token_ids[0] == top[0]
    # the logprobs are the model's own: the banned argmax is still the top one
    lp, raw = out.logprobs[4], logits[4].log_softmax(-1)
    assert lp is not None and lp.top_ids[0] == top[4]
    assert lp.logprob == pytest.approx(raw[out.token_ids[4]].item(), abs=1e-5)


def test_a_banned_token_is_never_sampled_and_a_forced_one_always():
    assert 0 not in _draw(temperature=1.5, logit_bias={0: -100})
    assert set(_draw(temperature=2.0, logit_bias={4: 100})) == {4}
    tokens = _draw(top_k=2, logit_bias={0: -100, 1: -100})  # top-k after the bias
    assert set(tokens) == {2, 3}


def test_logit_bias_leaves_the_fast_path_and_keeps_the_grammar(monkeypatch):
    logits = torch.randn(2, 64, generator=torch.Generator().manual_seed(5))
    greedy = _row(temperature=0.0)
    biased = _row(temperature=0.0, logit_bias={3: 100})
    assert Sampler.plain_greedy([greedy]) and not Sampler.plain_greedy([greedy, biased])
    assert not Sampler.plain_greedy([_row(temperature=0.0, logit_bias={3: -5.0})])
    assert Sampler.plain_greedy([_row(temperature=0.0, logit_bias={})])  # asks for nothing
    assert Sampler(64, [EOS])(logits, [greedy, biased]).token_ids == [logits[0].argmax(), 3]
    # a token the grammar forbids stays forbidden whatever its bias
    words = torch.full((2,), -1, dtype=torch.int32)  # tokens 0..63 allowed
    words[0] &= ~(1 << 3)  # but 3
    row = SamplingRow(
        SamplingParams(temperature=0.0, logit_bias={3: 100.0}), [], [], token_bitmask=words
    )
    assert Sampler(64, [EOS])(logits[1:], [row]).token_ids != [3]
    monkeypatch.setattr(
        sampling, "apply_logit_bias", lambda lg, rows, idx=None: lg
    )  # the bias undone
    assert Sampler(64, [EOS])(logits, [greedy, biased]).token_ids[1] != 3


def test_apply_logit_bias_adds_in_its_rows_only_and_copies():
    logits = torch.zeros(3, 8)
    rows = [_row(logit_bias={1: 2.5, 7: -100}), _row(), _row(logit_bias={0: 100, 99: 5.0})]
    out = apply_logit_bias(logits, rows)  # 99: past these logits' width, skipped
    want = torch.zeros(3, 8)
    want[0, 1], want[0, 7], want[2, 0] = 2.5, -100.0, 100.0
    assert torch.equal(out, want) and torch.equal(logits, torch.zeros(3, 8))
    assert apply_logit_bias(logits, [_row()] * 3) is logits  # nothing to do: no copy


@pytest.mark.parametrize(
    "kw, allowed",
    [
        (dict(top_k=2), {0, 1}),
        (dict(top_p=0.65), {0, 1}),
        (dict(top_p=0.75), {0, 1, 2}),
        (dict(top_p=0.8), {0, 1, 2}),
        (dict(top_k=3, top_p=0.8), {0, 1}),  # top-p sees the top-k renormalized mass
        (dict(min_p=0.3), {0, 1, 2}),  # keep p >= 0.3 * 0.4
        (dict(min_p=0.5), {0, 1}),
        (dict(top_k=4, min_p=0.3, temperature=0.5), {0, 1}),  # T=0.5 sharpens before min-p
    ],
)
def test_filters_never_sample_outside_the_allowed_set(kw, allowed):
    torch.manual_seed(0)
    counts = _counts(_draw(**kw), 5)
    assert {t for t, c in enumerate(counts) if c} == allowed
    # the kept tokens keep their relative probabilities
    t = kw.get("temperature", 1.0)
    weights = {i: PROBS[i] ** (1 / t) for i in allowed}
    for i in allowed:
        assert counts[i] / 2000 == pytest.approx(weights[i] / sum(weights.values()), abs=0.05)


def test_top_p_support_matches_a_full_sort():
    # nuclei of every size: a few tokens, hundreds, thousands, nearly the whole vocabulary
    vocab = 6000
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(6, vocab, generator=gen) * torch.tensor(
        [[6.0], [2.5], [2.0], [0.5], [0.1], [2.0]]
    )
    params = [SamplingParams(top_p=0.9)] * 5 + [SamplingParams(top_p=0.9, top_k=700, min_p=0.02)]
    probs = sampling_probs(logits, params)
    for i, p in enumerate(params):
        row = logits[i]
        if p.top_k > 0:
            row = row.masked_fill(row < row.topk(p.top_k).values[-1], float("-inf"))
        ref = row.softmax(-1)
        desc = ref.sort(descending=True).values
        cut = desc[((desc.cumsum(-1) - desc) < p.top_p).sum() - 1]
        keep = (ref >= cut) & (ref >= p.min_p * ref.max())
        assert torch.equal(probs[i] > 0, keep), i
    sizes = (probs[:5] > 0).sum(-1).tolist()
    assert sizes[0] < 256 < sizes[1] < 4096 < sizes[3] and sizes == sorted(sizes), sizes
    # rows without top-p / min-p keep every token
    assert (sampling_probs(logits, [SamplingParams()] * 6) > 0).all()


def test_mixed_filters_in_one_batch():
    torch.manual_seed(0)
    n = 3000
    rows = [_row(top_k=2), _row(top_p=0.65), _row()]
    batch = [rows[i % 4] if i % 4 < 3 else _row(top_k=3, seed=9 + i) for i in range(n)]
    tokens = Sampler(5, [])(LOGITS.expand(n, -1), batch).token_ids
    per_kind = [set(tokens[k::4]) for k in range(4)]
    assert per_kind == [{0, 1}, {0, 1}, {0, 1, 2, 3, 4}, {0, 1, 2}]


def test_padded_vocab_columns_are_never_sampled():
    logits = torch.zeros(100, 12)
    logits[:, 10:] = 50.0  # padding past the real vocabulary
    for kw in (dict(temperature=0.0), dict(), dict(top_p=0.5)):
        tokens = Sampler(10, [])(logits, [_row(**kw)] * 100).token_ids
        assert max(tokens) < 10


@pytest.mark.parametrize("temperature", [0.5, 1.0, 2.0])
def test_temperature_shapes_the_distribution(temperature):
    torch.manual_seed(0)
    n = 4000
    logits = torch.tensor([[2.0, 0.0]]).expand(n, -1)
    tokens = Sampler(2, [])(logits, [_row(temperature=temperature)] * n).token_ids
    p0 = 1 / (1 + math.exp(-2.0 / temperature))
    assert tokens.count(0) / n == pytest.approx(p0, abs=0.03)


def test_tiny_temperature_is_greedy():
    logits = torch.tensor([[1.0, 1.0 + 1e-3, 0.5]] * 50)
    assert set(Sampler(3, [])(logits, [_row(temperature=1e-9)] * 50).token_ids) == {1}


@pytest.mark.parametrize(
    "kw",
    [dict(top_p=1e-46), dict(top_p=float(torch.finfo(torch.float32).tiny))],
    ids=["top_p-0-in-float32", "top_p-tiny"],
)
def test_a_vanishing_top_p_keeps_the_most_likely_token(kw):
    """top_p is in (0, 1] but may be 0 once it is a float32: the first token is kept."""
    tokens = Sampler(5, [])(LOGITS.expand(50, -1), [_row(**kw)] * 50).token_ids
    assert set(tokens) == {0}


def test_a_vanishing_repetition_penalty_samples_among_the_seen_tokens():
    """A repetition_penalty of 1e-38 divides positive logits to +inf: still a valid draw
    (no NaN), among the tokens that went to +inf, for sampled and greedy rows alike."""
    torch.manual_seed(0)
    logits = torch.tensor([[5.0, 6.0, 7.0, -1.0, 0.5]] * 200)  # 5 / 1e-38 > float32 max
    rows = [
        _row(prompt=[0, 1], repetition_penalty=1e-38, top_p=0.9, temperature=t) for t in (1.0, 0.0)
    ] * 100
    tokens = Sampler(5, [])(logits, rows).token_ids
    assert set(tokens[0::2]) == {0, 1} and set(tokens[1::2]) <= {0, 1}  # both are +inf


def test_rows_with_inf_or_nan_logits_are_repaired_alone():
    """softmax turns a row holding +inf or NaN into NaN everywhere; only those rows go
    through nan_to_num (+inf to the largest float, NaN to -inf): their draws come from the
    +inf tokens, the finite rows' probabilities are untouched."""
    from scheduler_worker.sampling import sampling_probs

    torch.manual_seed(1)
    logits = torch.randn(6, 300)
    logits[1, 200] = logits[1, 250] = float("inf")
    logits[3, 7] = float("nan")
    logits[3, 150] = float("inf")
    params = [SamplingParams(temperature=1.0)] * 6
    probs = sampling_probs(logits, params)
    assert not probs.isnan().any()
    good = [0, 2, 4, 5]
    assert torch.equal(probs[good], logits[good].softmax(-1))
    assert set(probs[1].nonzero().flatten().tolist()) == {200, 250}
    assert probs[3].nonzero().flatten().tolist() == [150]
    rows = [_row(temperature=1.0, seed=i) for i in range(6)]
    for _ in range(20):
        tokens = Sampler(300, [])(logits, rows).token_ids
        assert tokens[1] in (200, 250) and tokens[3] == 150


def test_sample_from_draws_every_token_at_its_probability():
    """The two-level race over several blocks (the last one partial): frequencies match
    p / sum(p) per group of tokens, and zero-probability tokens (holes, a whole empty
    block, an empty tail) are never drawn, even with uniforms of 0."""
    from scheduler_worker.sampling import SAMPLE_BLOCK, num_uniforms, sample_from

    vocab = 3 * SAMPLE_BLOCK + 100
    gen = torch.Generator().manual_seed(5)
    p = torch.rand(vocab, generator=gen) ** 3
    p[::7] = 0.0
    p[SAMPLE_BLOCK : 2 * SAMPLE_BLOCK] = 0.0
    p[-30:] = 0.0
    n = 200_000
    u = torch.rand(n, num_uniforms(vocab), generator=gen)
    u[:100, ::3] = 0.0  # a uniform of 0 is an infinite q: that entry loses, nothing breaks
    tokens = sample_from(p.expand(n, -1), u)
    assert p[tokens].min() > 0
    counts = torch.bincount(tokens[100:], minlength=vocab).double()
    groups = 40
    cut = vocab // groups * groups
    want = (p / p.sum()).double()[:cut].view(groups, -1).sum(-1)
    got = counts[:cut].view(groups, -1).sum(-1) / (n - 100)
    assert torch.allclose(got, want, atol=4 * (want / n).sqrt().max().item()), (
        (got - want).abs().max()
    )
