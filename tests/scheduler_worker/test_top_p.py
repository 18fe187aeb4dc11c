"""Top-p without a sort (scheduler_worker.top_p): the same kept set as a full sort with
the mass summed in float64, on every way to it (windows, the radix search, a top-k row's
candidates), on random and adversarial rows; main's seeded tokens unchanged; where main's
float32 sum decided otherwise, only at a near-tie of its rounding."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from common.sampling_params import SamplingParams
from scheduler_worker import sampling, top_p
from scheduler_worker.logits_processors import SamplingRow
from scheduler_worker.sampling import Sampler, sampling_probs
from tests.scheduler_worker.test_sampling_device import _no_host_sync, cuda

TOP_PS = [0.5, 0.9, 0.95, 0.99, 0.999, 1e-30, 0.0, 0.99999994]  # 0.0: a top_p of 1e-46


def _exact_cut(probs: torch.Tensor, want: torch.Tensor) -> torch.Tensor:
    """The reference: every row sorted, the mass above each token summed in float64, the
    tokens kept while it is below top_p (the first always), with every tie of the last."""
    desc = probs.sort(dim=-1, descending=True).values.double()
    above = desc.cumsum(dim=-1) - desc
    num_keep = (above < want.double()).sum(dim=-1, keepdim=True).clamp(min=1)
    return probs >= desc.gather(1, num_keep - 1).float()


def _f32_cut(probs: torch.Tensor, want: torch.Tensor) -> torch.Tensor:
    """main's rule (2cd4c57): the same with a float32 cumsum."""
    desc = probs.sort(dim=-1, descending=True).values
    num_keep = ((desc.cumsum(dim=-1) - desc) < want).sum(dim=-1, keepdim=True).clamp(min=1)
    return probs >= desc.gather(1, num_keep - 1)


def _rows(vocab: int) -> dict[str, torch.Tensor]:
    """Probabilities [vocab] of every kind, float32, each a softmax's output or exact."""
    g = torch.Generator().manual_seed(vocab)
    randn = lambda scale: (torch.randn(vocab, generator=g) * scale).softmax(-1)  # noqa: E731
    ranks = torch.randperm(vocab, generator=g).double() + 1
    one_hot = torch.zeros(vocab)
    one_hot[vocab // 3] = 1.0
    two = torch.where(torch.arange(vocab) % 3 == 0, 3.0, 1.0)  # two values, ties at any cut
    few = torch.full((vocab,), float("-inf"))
    few[torch.randperm(vocab, generator=g)[:40]] = torch.randn(40, generator=g)  # top-k's zeros
    return {
        "peaked": randn(3.0),
        "medium": randn(1.0),
        "flat": randn(0.1),
        "zipf": (ranks**-1.3 / (ranks**-1.3).sum()).float(),
        "uniform": torch.full((vocab,), 1.0 / vocab),
        "one_hot": one_hot,
        "two_values": two / two.sum(),
        "integer_logits": torch.randint(-4, 4, (vocab,), generator=g).float().softmax(-1),
        "underflow": randn(40.0),  # zeros and subnormals in the tail
        "few_nonzero": few.softmax(-1),
    }


@pytest.mark.parametrize("vocab", [6000, 49152, 128256])
def test_every_way_keeps_what_a_full_sort_keeps(vocab):
    rows = _rows(vocab)
    probs = torch.stack(list(rows.values()))
    names = list(rows) * len(TOP_PS)
    probs = probs.repeat(len(TOP_PS), 1)
    want = torch.tensor(TOP_PS).repeat_interleave(len(rows))[:, None]
    ref = _exact_cut(probs, want)
    ways = {
        "cpu": top_p.top_p_threshold(probs, want, may_branch=True),
        "gpu": top_p.top_p_threshold(probs, want, may_branch=False),
        "radix": top_p.radix_threshold(probs, want),
    }
    for way, thresh in ways.items():
        kept = probs >= thresh
        bad = [
            (names[i], want[i].item())
            for i in range(len(names))
            if not torch.equal(kept[i], ref[i])
        ]
        assert not bad, (way, bad)
    counts = ref.sum(-1).view(len(TOP_PS), len(rows))
    base = torch.stack(list(rows.values()))
    tops = (base == base.amax(-1, keepdim=True)).sum(-1)  # the most likely value's tokens
    assert torch.equal(counts[TOP_PS.index(0.0)], tops) and tops.max() == vocab  # uniform
    sizes = counts[TOP_PS.index(0.99)]
    assert sizes.min() == 1 and sizes.max() == vocab  # one token (one-hot) to all (uniform)
    assert sizes[list(rows).index("flat")] > max(top_p.TOP_P_WINDOWS)  # the search's case


def test_a_vanishing_top_p_keeps_the_most_likely_tokens_and_a_top_p_past_the_mass_all():
    rows = _rows(49152)
    probs = torch.stack(list(rows.values()))
    for way in (True, False):
        for tiny in (0.0, 1e-30, 1e-45):
            want = torch.full((len(rows), 1), tiny)
            kept = probs >= top_p.top_p_threshold(probs, want, may_branch=way)
            assert torch.equal(kept, probs == probs.amax(-1, keepdim=True))
        past = torch.full((len(rows), 1), 0.99999994)  # above a float32 softmax's total here
        kept = probs >= top_p.top_p_threshold(probs, past, may_branch=way)
        total = probs.double().sum(-1)
        assert all(kept[i].all() for i in range(len(rows)) if total[i] < past[i].double())


def test_the_radix_search_takes_any_float_without_an_out_of_range_index():
    """NaN, +inf, -0.0 and values past 1 are no distribution, but never index past a
    histogram (on a GPU that would be a device-side assert)."""
    probs = torch.rand(4, 5000)
    probs[0, 3] = float("nan")
    probs[1, 9] = float("inf")
    probs[2, 100] = -0.0
    probs[3] *= 7.0
    thresh = top_p.radix_threshold(probs, torch.full((4, 1), 0.9))
    assert thresh.shape == (4, 1)


def _reference_probs(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """sampling_probs the long way: the top-k cut by a sort, the softmax, the exact top-p
    cut, min-p."""
    out = []
    for row, p in zip(logits, params):
        row = row / p.temperature
        if 0 < p.top_k < row.numel():
            row = row.masked_fill(
                row < row.sort(descending=True).values[p.top_k - 1], float("-inf")
            )
        probs = row.softmax(-1)[None]
        keep = _exact_cut(probs, torch.tensor([[p.top_p]])) if p.top_p < 1.0 else probs >= 0
        keep &= probs >= probs.max() * p.min_p
        out.append(probs.masked_fill(~keep, 0.0)[0])
    return torch.stack(out)


@pytest.mark.parametrize("device_way", [False, True], ids=["cpu_way", "gpu_way"])
def test_top_k_and_top_p_combined_match_the_long_way(monkeypatch, device_way):
    """A top-k row's cut from its candidates, ties at the k-th logit (integer logits) kept
    past them, a k past TOP_K_WINDOW (the search instead), rows without top-k in the same
    batch, min-p on top."""
    if device_way:
        monkeypatch.setattr(sampling, "enqueues_work", lambda device: True)
    vocab = 20000
    g = torch.Generator().manual_seed(7)
    kinds = []
    for k in (1, 2, 40, 50, 300):
        for p in (0.5, 0.9, 0.95, 1.0):
            kinds.append(dict(top_k=k, top_p=p, temperature=0.8))
    kinds += [dict(top_p=0.9), dict(top_p=0.95, min_p=0.05), dict(top_k=40, top_p=0.9, min_p=0.1)]
    logits = torch.randn(len(kinds), vocab, generator=g) * 2
    logits[1::3] = torch.randint(-6, 3, (len(kinds[1::3]), vocab), generator=g).float()  # ties
    params = [SamplingParams(**kw) for kw in kinds]
    got = sampling_probs(logits, params)
    assert torch.equal(got > 0, _reference_probs(logits, params) > 0)
    assert torch.allclose(got, _reference_probs(logits, params))
    assert (got[1::3] > 0).sum(-1).max() > 300  # ties carried a cut past the candidates
    big = [
        SamplingParams(top_k=top_p.TOP_K_WINDOW + 1, top_p=0.9),
        SamplingParams(top_k=40, top_p=0.9),
    ]
    got = sampling_probs(logits[:2], big)
    assert torch.equal(got > 0, _reference_probs(logits[:2], big) > 0)


@pytest.mark.parametrize("device_way", [False, True], ids=["cpu_way", "gpu_way"])
def test_top_k_rows_with_inf_or_nan_logits_keep_the_inf_tokens(monkeypatch, device_way):
    """A +inf or NaN logit (an extreme penalty) in a top-k + top-p row: its candidates come
    NaN first, the repair gives NaN no mass and +inf all of it: the +inf tokens alone kept,
    as without top-p."""
    if device_way:
        monkeypatch.setattr(sampling, "enqueues_work", lambda device: True)
    logits = torch.randn(4, 9000, generator=torch.Generator().manual_seed(3))
    logits[:, 10] = float("nan")
    logits[:2, [20, 30]] = float("inf")
    logits[2:, 40] = 50.0
    params = [SamplingParams(top_k=k, top_p=0.6) for k in (5, 50, 5, 50)]
    kept = sampling_probs(logits, params) > 0
    assert [row.nonzero()[:, 0].tolist() for row in kept] == [[20, 30], [20, 30], [40], [40]]


@pytest.mark.parametrize("way", ["window", "radix", "sort"])
def test_float32_near_ties_are_the_only_rows_unlike_main(monkeypatch, way):
    """main summed the mass above a token in float32: where that sum rounded onto top_p
    (within ~6e-8), it dropped a token whose exact mass above is below top_p, or kept one
    past it. Now the float64 sum decides, whichever way finds the cut. Rows of 6000 tokens
    at top_p 0.999 (tokens of ~1e-7 at the cut): a few rows differ, each by the tokens of
    one value at the cut, whose mass above lies within float32 rounding of top_p."""
    monkeypatch.setattr(top_p, "TOP_P_WINDOWS", (4096,))  # nuclei of ~3000 tokens
    if way == "sort":
        monkeypatch.setattr(top_p, "SORT_VOCAB", 6000)
    g = torch.Generator().manual_seed(0)
    probs = (torch.randn(64, 6000, generator=g) * 3).softmax(-1)
    want = torch.full((64, 1), 0.999)
    new = probs >= top_p.top_p_threshold(probs, want, may_branch=way != "radix")
    old = _f32_cut(probs, want)
    assert torch.equal(new, _exact_cut(probs, want))
    differ = (new != old).any(-1).nonzero()[:, 0].tolist()
    assert 0 < len(differ) < 16, differ
    for i in differ:
        moved = (new[i] != old[i]).nonzero()[:, 0]
        assert probs[i, moved].unique().numel() == 1  # the tokens of one value
        above = probs[i].double()[probs[i] > probs[i, moved[0]]].sum().item()
        assert abs(above - want[i].double().item()) < 2e-7, (i, above)


# main's sampler (2cd4c57) on a chat-like batch, recorded before the change: a seed a row,
# (temperature, top_p, top_k, min_p, logit scale)
MIX = [
    (0.7, 0.9, -1, 0.0, 3.0), (1.0, 0.95, -1, 0.0, 3.0), (0.8, 0.9, 40, 0.0, 2.0),
    (1.0, 0.95, 50, 0.0, 4.0), (0.9, 0.9, -1, 0.05, 2.0), (1.0, 0.9, -1, 0.0, 0.1),
    (0.7, 0.95, -1, 0.0, 8.0), (1.0, 0.92, -1, 0.0, 1.0), (1.0, 1.0, 40, 0.0, 2.0),
    (0.75, 0.9, 45, 0.0, 0.5), (1.0, 0.5, -1, 0.0, 0.2), (0.8, 0.99, -1, 0.0, 2.5),
]  # fmt: skip
MAIN_TOKENS = {
    49152: [
        [37997, 7117, 26459, 4796, 7347, 21610, 36003, 4722, 19492, 31488, 19627, 12650],
        [23494, 49020, 34333, 27123, 29625, 5939, 26003, 41513, 11976, 17120, 48868, 4471],
        [12414, 32489, 6532, 14235, 42646, 32737, 27321, 38727, 13374, 18245, 33098, 39313],
    ],
    128256: [
        [76946, 28787, 100338, 116668, 29855, 76446, 33099, 78389, 65968, 77243, 19595, 51699],
        [21993, 90776, 104054, 53120, 24879, 62343, 126228, 126163, 42503, 50625, 48651, 85922],
        [100384, 113625, 47991, 62402, 115058, 106836, 61378, 117496, 72657, 44778, 33088, 53983],
    ],
}  # fmt: skip
MAIN_KEPT = {  # tokens each row kept
    49152: [
        [250, 4570, 32, 38, 78, 43312, 2, 32180, 40, 40, 20677, 8965],
        [230, 4448, 32, 41, 131, 43321, 9, 32307, 40, 40, 20669, 9213],
        [174, 3119, 31, 37, 88, 43324, 5, 32315, 40, 40, 20671, 9192],
    ],
    128256: [
        [371, 12686, 32, 38, 9, 113037, 9, 84395, 40, 40, 53944, 27789],
        [158, 4495, 33, 32, 230, 113041, 10, 84198, 40, 40, 53957, 27180],
        [179, 13076, 31, 40, 172, 113037, 4, 84411, 40, 40, 53972, 24624],
    ],
}  # fmt: skip
# the one near-tie: 128256, step 2, row 11 (top_p 0.99): the 24,625th token's exact mass
# above is 0.98999995, below top_p (0.99000001 in float32); main's float32 sum made it
# 0.99000001, not below, and dropped the token (p = 7.4e-7)
NEAR_TIES = {(128256, 2, 11): 24625}
# main's counts were taken on an AVX-512 CPU. Another kind's torch (an AVX2 CPU's, or
# ATEN_CPU_CAPABILITY=avx2) computes the softmax with other float32 roundings, and a row's
# mass near its cut moves by up to ~1e-5 (measured: 4.7e-6 to 7.9e-6): a top_p row whose cut
# falls in that band keeps a few tail tokens more or fewer (1-12 here, each p < 1e-5). Such a
# row must keep what the rule keeps of this CPU's probabilities, both cuts within KIND_MASS
# of its top_p (docs/benchmarks.md, "The suite as an AVX2 CPU runs it")
KIND_MASS = 2e-5


def _chat_batch(vocab: int, step: int) -> tuple[torch.Tensor, list[SamplingRow]]:
    gen = torch.Generator().manual_seed(1000 * step + vocab % 997)
    scales = torch.tensor([m[4] for m in MIX])[:, None]
    logits = torch.randn(len(MIX), vocab, generator=gen) * scales
    rows = [
        SamplingRow(SamplingParams(temperature=t, top_p=p, top_k=k, min_p=mp, seed=11 + 7 * i), [], [5] * step)
        for i, (t, p, k, mp, _) in enumerate(MIX)
    ]  # fmt: skip
    return logits, rows


@pytest.mark.parametrize("device_way", [False, True], ids=["cpu_way", "gpu_way"])
@pytest.mark.parametrize("vocab", [49152, 128256])
def test_seeded_tokens_are_mains(monkeypatch, vocab, device_way):
    if device_way:
        monkeypatch.setattr(sampling, "enqueues_work", lambda device: True)
    for step in range(3):
        logits, rows = _chat_batch(vocab, step)
        assert Sampler(vocab, [])(logits, rows).token_ids == MAIN_TOKENS[vocab][step]
        kept = (sampling_probs(logits, [r.params for r in rows]) > 0).sum(-1).tolist()
        want = [NEAR_TIES.get((vocab, step, i), n) for i, n in enumerate(MAIN_KEPT[vocab][step])]
        for i in (i for i, (a, b) in enumerate(zip(kept, want)) if a != b):
            assert _a_cut_within_kind_rounding(logits[i], rows[i].params, kept[i], want[i]), i
            kept[i] = want[i]
        assert kept == want


def _a_cut_within_kind_rounding(logits: torch.Tensor, params, here: int, main: int) -> bool:
    """A top_p row (no top_k, no min_p) keeps `here` tokens by this CPU's probabilities where
    main kept `main`: `here` is the rule's cut of them (the mass of the first here - 1 below
    top_p, of the first `here` not), and both cuts lie within KIND_MASS of top_p."""
    if params.top_k > 0 or params.min_p > 0 or params.top_p >= 1.0:
        return False
    full = sampling_probs(logits[None], [replace(params, top_p=1.0)])[0]
    mass = full.double().sort(descending=True).values.cumsum(0)
    rule = mass[here - 2].item() < params.top_p <= mass[here - 1].item() + 1e-7
    return rule and all(abs(mass[n - 1].item() - params.top_p) < KIND_MASS for n in (here, main))


@cuda
def test_the_radix_search_on_cuda_keeps_what_the_cpu_keeps_and_never_waits():
    rows = _rows(128256)
    probs = torch.stack(list(rows.values())).repeat(4, 1)
    want = torch.tensor([0.5, 0.9, 0.95, 0.999]).repeat_interleave(len(rows))[:, None]
    on_cpu = probs >= top_p.top_p_threshold(probs, want, may_branch=True)
    dev_probs, dev_want = probs.cuda(), want.cuda()
    top_p.radix_threshold(dev_probs, dev_want)  # lazy initializations, outside the check
    with _no_host_sync():
        thresh = top_p.radix_threshold(dev_probs, dev_want)
    assert torch.equal((dev_probs >= thresh).cpu(), on_cpu)
    params = [SamplingParams(top_p=0.9, temperature=0.8)] * 8 + [
        SamplingParams(top_k=50, top_p=0.9)
    ] * 8
    logits = torch.randn(16, 128256, device="cuda")
    sampling_probs(logits, params)
    with _no_host_sync():
        got = sampling_probs(logits, params)
    assert torch.equal(got.cpu() > 0, sampling_probs(logits.cpu(), params) > 0)
