"""The sampler ops, the CPU's C++ one (kernels/csrc/sample_rows.cpp, scheduler_worker/draws.py)
and the GPU's Triton kernel (backends/triton_sample.py, in Triton's interpreter on a CPU),
against the torch path (sampling.sampling_probs + sample_from) on the same uniforms: the
same tokens, but where the two race values that decide are a near-tie (their exp and
float32 sums are not torch's). Every ISA path this CPU runs; the torch path's own bits
differ by CPU kind too, so a token that differs must be a near-tie, checked, not a count."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from common.sampling_params import SamplingParams
from scheduler_worker import kernels
from scheduler_worker.backends.base import DrawRows
from scheduler_worker.batch_params import MIN_P, NUM_VALUES, TEMPERATURE, TOP_K, TOP_P
from scheduler_worker.draws import _KERNEL_COLUMNS
from scheduler_worker.sampling import (
    SAMPLE_BLOCK,
    Sampler,
    SamplingRow,
    greedy_tokens,
    num_uniforms,
    sample_from,
    sampling_probs,
)

needs_kernels = pytest.mark.skipif(not kernels.load(), reason="the C++ kernels are not built here")
ISAS = list(range(kernels.isa_index(kernels.best_isa()) + 1)) if kernels.load() else []
# the ops: each ISA path of the C++ one, and the Triton kernel ("triton": a GPU's, run in
# the interpreter where there is none; tests/conftest.py sets TRITON_INTERPRET first)
OPS: list = [*ISAS, "triton"]
# where the kernel runs: compiled on a GPU (benchmarks/gpu_check.sh runs this file there),
# else interpreted on the CPU
TRITON_DEV = (
    "cuda" if torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1" else "cpu"
)
TIE = 1e-5  # relative: two race values closer than this may order either way


def _chat_logits(rows: int, vocab: int, seed: int) -> torch.Tensor:
    """A chat model's next-token rows: p ~ rank^-a over a shuffled vocabulary
    (benchmarks/bench_top_p.py's "chat" rows), a few near-flat ones among them."""
    gen = torch.Generator().manual_seed(seed)
    a = 1.28 + torch.exp(torch.randn(rows, 1, generator=gen) * 0.76 - 1.14)
    a[::7] = 0.05  # nearly flat: the nucleus is most of the vocabulary
    ranks = torch.argsort(torch.rand(rows, vocab, generator=gen), dim=-1).float() + 1
    return -a * ranks.log() + 0.1 * torch.randn(rows, vocab, generator=gen)


def _values(rows: int, **cols: list[float]) -> np.ndarray:
    values = np.zeros((rows, NUM_VALUES))
    values[:, TEMPERATURE] = 1.0
    values[:, TOP_P] = 1.0
    for name, col in cols.items():
        idx = {"temperature": TEMPERATURE, "top_k": TOP_K, "top_p": TOP_P, "min_p": MIN_P}[name]
        values[:, idx] = np.resize(np.array(col, dtype=np.float64), rows)
    return values


def _triton_op():
    from scheduler_worker.backends.triton_sample import sample_rows

    return sample_rows


def _triton_keyed():
    from scheduler_worker.backends.triton_sample import sample_rows_keyed

    return sample_rows_keyed


def _op(logits, values, u, op, draw=None):
    """op: an ISA index (the C++ op) or "triton" (the kernel, on the logits' device). The
    logits go as they are: both ops read rows a stride apart (a padded vocabulary's view)."""
    draw = torch.arange(len(logits)) if draw is None else draw
    params = torch.from_numpy(np.ascontiguousarray(values[:, _KERNEL_COLUMNS]))
    if op == "triton":
        on = [t.to(TRITON_DEV) for t in (logits, draw, params, u)]
        return _triton_op()(*on).cpu()
    return torch.ops.zeroserve.sample_rows(logits, draw, params, u, op)


def _near_tie(probs: torch.Tensor, u: torch.Tensor, a: int, b: int) -> bool:
    """Whether tokens a and b of one row (probs: the torch path's, u: its uniforms) are a
    near-tie of the race: their blocks' race values if the blocks differ, else their own."""
    vocab = probs.shape[0]
    p = torch.nn.functional.pad(probs, (0, -vocab % SAMPLE_BLOCK)).view(-1, SAMPLE_BLOCK)
    nb = p.shape[0]
    if a // SAMPLE_BLOCK != b // SAMPLE_BLOCK:
        r = p.sum(-1) / u[:nb].log()
        ra, rb = r[a // SAMPLE_BLOCK], r[b // SAMPLE_BLOCK]
    else:
        r = p[a // SAMPLE_BLOCK] / u[nb:].log()
        ra, rb = r[a % SAMPLE_BLOCK], r[b % SAMPLE_BLOCK]
    return bool((ra - rb).abs() <= TIE * max(ra.abs(), rb.abs()))


def _check_against_torch(logits, values, op, trials=4, seed=0):
    n = num_uniforms(logits.shape[1])
    gen = torch.Generator().manual_seed(seed)
    probs = sampling_probs(logits, values)
    differ = 0
    for _ in range(trials):
        u = torch.rand(len(logits), n, generator=gen)
        want, got = sample_from(probs, u), _op(logits, values, u, op)
        for r in (want != got).nonzero()[:, 0].tolist():
            assert probs[r, got[r]] > 0, f"row {r}: token {got[r]} was cut by the torch path"
            assert _near_tie(probs[r], u[r], int(want[r]), int(got[r])), (
                f"row {r}: {int(got[r])} where the torch path drew {int(want[r])}"
            )
            differ += 1
    return differ


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("vocab", [5, 1000, 49152])
def test_draws_the_torch_paths_tokens(op, vocab):
    """Temperature, top-k (a heap, and past 4096 a selection; the kernel's bisection),
    top-p (0.9, 0.95, near 1 where the candidates fall short, below float32's tiny),
    min-p, each alone and together. The interpreted kernel draws once, 8 rows at the
    default vocabulary (each of its top-k rows reads the row 32 times)."""
    rows, trials = (48, 4) if op != "triton" else (8 if vocab > 1000 else 48, 1)
    logits = _chat_logits(rows, vocab, seed=vocab)
    values = _values(
        rows,
        temperature=[0.7, 1.0, 0.8, 1.3, 0.5, 1.0],
        top_k=[0, 0, 40, 0, 5000, 0, 0, 3],
        top_p=[0.9, 1.0, 0.95, 0.9999999, 1e-40, 0.5, 1.0],
        min_p=[0.0, 0.05, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.2],
    )
    differ = _check_against_torch(logits, values, op, trials)
    assert differ <= 2  # near-ties are rare: each was checked to be one


@pytest.mark.parametrize(
    "op, cap", [*((op, None) for op in OPS), ("triton", 16)], ids=lambda v: str(v)
)
def test_the_cut_is_the_torch_paths_token_for_token(op, cap, monkeypatch):
    """Where each filter cuts, exactly: a row's uniforms all 1e-30 but those of one token
    (and its block) just below 1, which then wins the race if it is kept at all (its race
    value ~1e7 p against the others' ~p / 69). The most likely token the torch path cut
    must never come out; its least likely kept one (of p >= 1e-6 of the row's largest)
    must. cap 16: the kernel's scratch row too small for any row's top-p candidates, so
    its search first narrows the range over the whole row."""
    if cap is not None:
        from scheduler_worker.backends import triton_sample

        monkeypatch.setattr(triton_sample, "CAP", cap)
    vocab, rows = 3000, 12
    logits = _chat_logits(rows, vocab, seed=5)
    values = _values(
        rows,
        temperature=[0.7, 1.0, 1.3],
        top_p=[0.9, 0.5, 0.95, 1.0],
        min_p=[0.0, 0.0, 0.0, 0.0, 0.0, 0.1],
        top_k=[0, 0, 0, 0, 0, 0, 0, 50],
    )
    probs = sampling_probs(logits, values)
    n, nb = num_uniforms(vocab), -(-vocab // SAMPLE_BLOCK)
    for which in ("cut", "kept"):
        u = torch.full((rows, n), 1e-30)
        picked = []
        for r in range(rows):
            raw = logits[r].softmax(-1)
            kept = probs[r] > 0
            if which == "cut":  # the most likely token the filters took out (or none)
                t = int(raw.masked_fill(kept, -1.0).argmax()) if not kept.all() else -1
            else:  # the least likely kept
                fair = kept & (probs[r] >= 1e-6 * probs[r].max())
                t = int(probs[r].masked_fill(~fair, 2.0).argmin())
            picked.append(t)
            if t >= 0:
                u[r, t // SAMPLE_BLOCK] = u[r, nb + t % SAMPLE_BLOCK] = 1 - 1e-7
        got = _op(logits, values, u, op).tolist()
        for r, (g, t) in enumerate(zip(got, picked)):
            if which == "cut":
                assert g != t, f"row {r}: drew {t}, which the torch path cut"
            else:
                assert g == t, f"row {r}: drew {g}, not the kept {t}"


@pytest.mark.parametrize("op", OPS)
def test_masked_tokens_are_never_drawn_and_odd_rows(op):
    """A grammar's -inf tokens are never drawn (the op's exp is clamped, a masked token gets
    exactly 0); a row masked but for one token takes it; a row with +inf takes it; a row
    masked everywhere gives token 0, as the torch path does."""
    vocab = 3000
    logits = _chat_logits(6, vocab, seed=1)
    allowed = torch.zeros(vocab, dtype=torch.bool)
    allowed[torch.randperm(vocab, generator=torch.Generator().manual_seed(2))[:50]] = True
    logits[0].masked_fill_(~allowed, float("-inf"))
    logits[1] = float("-inf")
    logits[1, 2999] = 0.0
    logits[2, 1234] = float("inf")
    logits[3] = float("-inf")
    logits[4, 17] = float("nan")
    values = _values(6, temperature=[0.7], top_p=[0.9, 1.0])
    n = num_uniforms(vocab)
    for trial in range(20 if op != "triton" else 3):
        u = torch.rand(6, n, generator=torch.Generator().manual_seed(trial))
        got = _op(logits, values, u, op).tolist()
        assert allowed[got[0]] and got[1] == 2999 and got[2] == 1234 and got[3] == 0
        assert got[4] != 17
    assert _check_against_torch(logits[[0, 1, 2, 5]], values[[0, 1, 2, 5]], op) == 0


@pytest.mark.parametrize("op", OPS)
def test_argmax_rows_pick_what_torch_picks(op):
    """Rows without uniforms: the first of tied maxima, +inf, NaN, at a vector's width and
    past it; the drawing rows beside them take their own uniforms' row. The rows are a
    view of wider ones (a padded vocabulary): the op reads them a stride apart, in place."""
    gen = torch.Generator().manual_seed(0)
    for vocab in (5, 100, 49152):
        padded = torch.full((6, vocab + 19), 9.0)  # columns past the vocabulary: never read
        x = padded[:, :vocab]
        x.copy_(torch.randint(-3, 3, (6, vocab), generator=gen).float())
        x[1] = float("-inf")
        x[1, vocab - 1] = 0.0
        x[2, vocab // 2] = float("inf")
        x[3, vocab - 2] = float("nan")
        values = _values(6, temperature=[0.7])
        draw = torch.tensor([-1, -1, -1, -1, 1, 0])
        u = torch.rand(2, num_uniforms(vocab), generator=gen)
        got = _op(x, values, u, op, draw)
        assert got[:4].tolist() == greedy_tokens(x[:4]).tolist()
        probs = sampling_probs(x[4:], values[4:])
        assert got[4:].tolist() == sample_from(probs, u[[1, 0]]).tolist()


@pytest.mark.parametrize("op", ["cpp", "triton"])
def test_the_sampler_takes_the_op_and_keeps_seeds(monkeypatch, op):
    """Sampler with the kernels' isa, or with a backend's draw op (the GPU's Triton
    kernel): every row in the one op (no torch sampling_probs), greedy rows their argmax,
    a seeded row the same token alone and among others."""
    if op == "cpp" and not ISAS:
        pytest.skip("the C++ kernels are not built here")
    # the GPU backend's op: keyed (the uniforms made in the kernel from each row's key)
    keyed = DrawRows(_triton_keyed(), keyed=True, device=TRITON_DEV)
    isa, draw_rows = (ISAS[-1], None) if op == "cpp" else (None, keyed)
    vocab = 1000
    logits = _chat_logits(8, vocab, seed=3)
    dev = "cpu" if op == "cpp" else TRITON_DEV

    def rows(n):
        out = [SamplingRow(SamplingParams(temperature=0.8, top_p=0.9, seed=7), [], [1, 2])]
        out += [SamplingRow(SamplingParams(temperature=0.0), [], [])] * (n > 1)
        out += [SamplingRow(SamplingParams(temperature=1.0, top_k=20), [], [])] * (n - 2)
        return out

    alone = Sampler(vocab, [], isa, draw_rows)(logits[:1].to(dev), rows(1)).token_ids
    torch_path = Sampler(vocab, [])(logits[:1], rows(1)).token_ids

    def boom(*a, **k):
        raise AssertionError("the kernels' sampler ran the torch path")

    monkeypatch.setattr("scheduler_worker.sampling.sampling_probs", boom)
    among = Sampler(vocab, [], isa, draw_rows)(logits.to(dev), rows(8)).token_ids
    assert among[0] == alone[0] == torch_path[0]
    assert among[1] == int(logits[1].argmax())
    # a model whose vocabulary is padded: the sampler's view of the first `vocab` columns
    padded = torch.cat([logits, torch.full((8, 13), 50.0)], dim=1).to(dev)
    assert Sampler(vocab, [], isa, draw_rows)(padded, rows(8)).token_ids[:2] == among[:2]
    if op == "cpp":  # a backend's op for another device is not handed host logits
        elsewhere = DrawRows(boom, keyed=True, device="cuda")
        assert Sampler(vocab, [], isa, elsewhere)(logits, rows(8)).token_ids[:2] == among[:2]


@needs_kernels
@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("vocab", [7, 1000, 49152])
def test_logprob_rows_are_torchs_log_softmax_and_topk(isa, vocab):
    """The sampled tokens' logprobs and the top-n (ids and values) as log_softmax and topk
    give them, within float32 rounding; ties among the top-n in id order; n = 0 and n = V."""
    logits = _chat_logits(5, vocab, seed=vocab) * 3
    logits[1, :4] = logits[1].max()  # a tie at the top: ids 0..3 in order
    tokens = torch.tensor([0, 3, vocab - 1, 5 % vocab, vocab // 2])
    lp = logits.log_softmax(dim=-1)
    for n in sorted({0, 1, 5, min(20, vocab), vocab}):
        sampled, top, ids = torch.ops.zeroserve.logprob_rows(logits, tokens, n, isa)
        assert sampled.tolist() == pytest.approx(
            lp.gather(1, tokens[:, None])[:, 0].tolist(), abs=1e-5
        )
        assert top.shape == ids.shape == (5, n)
        if n == 0:
            continue
        want = lp.topk(n, dim=-1)
        assert top.flatten().tolist() == pytest.approx(want.values.flatten().tolist(), abs=1e-5)
        # the ids name the top-n values (torch's own logprobs at them)
        assert lp.gather(1, ids).flatten().tolist() == pytest.approx(
            want.values.flatten().tolist(), abs=1e-6
        )
        assert ids[1, : min(n, 4)].tolist() == list(range(min(n, 4)))
        assert all(len(set(r)) == n for r in ids.tolist())


def test_the_kernels_warm_up_runs_an_argmax_and_a_drawing_row(monkeypatch):
    """What CudaBackend.start launches so the first sampled step does not compile: its
    inputs pass the op's checks at a vocabulary that is no multiple of the race's blocks."""
    from scheduler_worker.backends import triton_sample

    calls = []
    real = triton_sample.sample_rows_keyed

    def spy(*args):
        calls.append(real(*args).tolist())
        return calls[-1]

    monkeypatch.setattr(triton_sample, "sample_rows_keyed", spy)
    triton_sample.warm_up(torch.device(TRITON_DEV), 300)
    assert calls == [[0, calls[0][1]]] and 0 <= calls[0][1] < 300


def test_the_keyed_kernel_makes_the_uniforms_seeded_uniforms_makes():
    """The GPU backend's variant (sample_rows_keyed) draws on uniforms it makes from each
    drawing row's key: the same tokens, to the bit, as the kernel given
    seeded_uniforms.row_uniforms of those keys (argmax rows beside them)."""
    from scheduler_worker.seeded_uniforms import row_uniforms

    vocab, rows = 1000, 10
    logits = _chat_logits(rows, vocab, seed=9)
    values = _values(rows, temperature=[0.7, 1.0, 1.3], top_p=[0.9, 1.0, 0.95])
    draw = torch.tensor([0, 1, -1, 2, 3, 4, -1, 5, 6, 7])
    keys = torch.randint(0, 1 << 32, (8,), generator=torch.Generator().manual_seed(4))
    params = torch.from_numpy(np.ascontiguousarray(values[:, _KERNEL_COLUMNS]))
    on = [t.to(TRITON_DEV) for t in (logits, draw, params, keys)]
    got = _triton_keyed()(*on).cpu()
    want = _op(logits, values, row_uniforms(keys, num_uniforms(vocab)), "triton", draw)
    assert got.tolist() == want.tolist()
    assert got[2] == logits[2].argmax() and got[6] == logits[6].argmax()


@pytest.mark.parametrize("op", [*OPS, "torch"])
def test_a_uniform_of_one_never_draws_a_masked_token(op):
    """The seeded hash's largest uniform rounds to 1.0 in float32: a masked token's race
    value was 0 / log(1) = NaN, which torch's argmin took (and the C++ op's first entry
    held). Token 5, then token 0, of a row masked there, with u 1.0 at that token."""
    vocab = 700
    n, nb = num_uniforms(vocab), -(-vocab // SAMPLE_BLOCK)
    for masked in (5, 0):
        logits = _chat_logits(1, vocab, seed=11)
        logits[0, masked] = float("-inf")
        values = _values(1, temperature=[1.0])
        u = torch.full((1, n), 0.5)
        u[0, nb + masked] = 1.0
        u[0, 0] = 1 - 1e-7  # block 0 wins the blocks' race
        if op == "torch":
            got = int(sample_from(sampling_probs(logits, values), u)[0])
        else:
            got = int(_op(logits, values, u, op)[0])
        assert got != masked and got < SAMPLE_BLOCK, got
