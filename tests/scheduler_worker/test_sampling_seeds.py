"""Seeds and the step in flight: a seeded row's draws (a hash of seed, token index and
column) whatever the batch, and penalties that count a token still being sampled."""

from __future__ import annotations

import numpy as np
import torch

from scheduler_worker.penalties import apply_penalties
from scheduler_worker.sampling import Sampler, seeded_uniforms
from tests.scheduler_worker.test_sampling import EOS, _row


def _seeded_run(batch_builder, steps: int = 12) -> list[int]:
    """Sample the target request (seed 77, top_p 0.9) for several steps; batch_builder
    places it in a batch and returns (logits, rows, index of the target)."""
    vocab = 40
    step_logits = torch.randn(steps, vocab, generator=torch.Generator().manual_seed(5))
    target = _row(seed=77, top_p=0.9, temperature=1.3)
    out: list[int] = []
    for step in range(steps):
        target.output_token_ids = list(out)
        logits, rows, pos = batch_builder(step_logits[step], target, step)
        out.append(Sampler(vocab, [EOS])(logits, rows).token_ids[pos])
    return out


def test_seed_is_reproducible_whatever_the_batch():
    def alone(row_logits, target, step):
        return row_logits[None], [target], 0

    def crowded(row_logits, target, step):
        torch.manual_seed(1000 + step)  # the unseeded rows' generator moves on differently
        others = [
            _row(),
            _row(seed=step, top_k=5),
            _row(temperature=0.0),
            _row(seed=77 + step, min_p=0.2, output=[1], repetition_penalty=1.2),
        ]
        pos = step % (len(others) + 1)
        rows = others[:pos] + [target] + others[pos:]
        logits = torch.randn(len(rows), row_logits.shape[0])
        logits[pos] = row_logits
        return logits, rows, pos

    torch.manual_seed(0)
    a = _seeded_run(alone)
    b = _seeded_run(crowded)
    assert a == b
    assert len(set(a)) > 3  # really sampling, not a constant


def test_different_seeds_differ_and_unseeded_rows_vary():
    logits = torch.zeros(1, 1000)
    draws = {seed: Sampler(1000, [])(logits, [_row(seed=seed)]).token_ids[0] for seed in range(5)}
    assert len(set(draws.values())) > 1
    unseeded = Sampler(1000, [])(torch.zeros(50, 1000), [_row()] * 50).token_ids
    assert len(set(unseeded)) > 25


def test_seeded_uniforms_are_a_function_of_seed_counter_and_column():
    """The counter-based draws: the same (seed, counter) gives the same row in any batch;
    the seed's high and low words, the counter and the column each change them; they are
    in (0, 1) and look uniform (mean, spread, every tenth of the range hit evenly)."""
    cpu = torch.device("cpu")
    seeds, counters = [7, 7, 7, -5, 2**63 + 7, 7 + (1 << 32)], [0, 1, 0, 0, 0, 0]
    u = seeded_uniforms(seeds, counters, 600, cpu)
    assert u.shape == (6, 600) and bool((u > 0).all() and (u < 1).all())
    assert torch.equal(u[0], u[2]) and not torch.equal(u[0], u[1])
    assert len({tuple(r.tolist()) for r in u[[0, 1, 3, 4, 5]]}) == 5
    alone = seeded_uniforms([7], [1], 600, cpu)
    assert torch.equal(alone[0], u[1])  # whatever the other rows
    big = seeded_uniforms(list(range(200)), [3] * 200, 500, cpu).flatten()
    assert abs(big.mean().item() - 0.5) < 0.005 and abs(big.std().item() - 12**-0.5) < 0.005
    tenths = torch.bincount((big * 10).long(), minlength=10).float() / big.numel()
    assert bool(((tenths - 0.1).abs() < 0.004).all())
    assert len(set(u[0].tolist())) > 590  # few repeats within a row


def test_seeded_uniforms_equal_the_all_device_hash():
    """The rows' keys hashed on the host (numpy) and the columns' hash kept per width give
    the numbers the hash gives when every step of it runs as torch ops (the seeds' draws
    of every earlier release), bit for bit, at two widths and twice each (the kept one)."""
    m32 = 0xFFFFFFFF

    def mix(x):
        x = ((x >> 16) ^ x) * 0x45D9F3B & m32
        x = ((x >> 16) ^ x) * 0x45D9F3B & m32
        return (x >> 16) ^ x

    rng = np.random.default_rng(0)
    seeds = [int(v) for v in rng.integers(-(2**63), 2**63 - 1, 40)] + [0, 7, 2**64 - 1]
    counters = [int(v) for v in rng.integers(0, 2**40, len(seeds))]
    for n in (450, 17, 450):
        keys = torch.tensor([[s & m32, (s >> 32) & m32, c & m32] for s, c in zip(seeds, counters)])
        k = mix(mix(mix(keys[:, 0] ^ 0x9E3779B9) ^ keys[:, 1]) ^ keys[:, 2])
        x = mix(k[:, None] ^ mix(torch.arange(n) + 0x632BE5AB)[None, :])
        want = ((x >> 8).float() + 0.5) * (1.0 / (1 << 24))
        got = seeded_uniforms(seeds, counters, n, torch.device("cpu"))
        assert torch.equal(got, want)


def test_a_seeded_sample_survives_an_ulp_of_noise():
    """The race moves only at near-ties: logits nudged by float32 rounding (another
    batch or a prefix-cache hit computes them in another order) keep nearly every seeded
    sample, where an inverse CDF would shift every boundary by the sum of the rounding."""
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(2000, 49152, generator=gen) * 3
    noisy = logits * (1 + 1e-6 * torch.randn(logits.shape, generator=gen))
    a = Sampler(49152, [])(logits, [_row(seed=i) for i in range(2000)]).token_ids
    b = Sampler(49152, [])(noisy, [_row(seed=i) for i in range(2000)]).token_ids
    assert sum(x != y for x, y in zip(a, b)) <= 4


def test_penalties_count_the_token_in_flight_read_on_the_device():
    """A row whose last output is still being sampled by the step in flight (its
    placeholder, -1, and pending_row) is penalized as if the token were on the host."""
    logits = torch.randn(3, 20, generator=torch.Generator().manual_seed(6))
    prev_tokens = torch.tensor([4, 11, 9])  # the step in flight's tokens, by its rows
    kw = dict(repetition_penalty=1.5, presence_penalty=0.7, frequency_penalty=0.4)
    known = [_row([3, 11, 11], [1, 2], **kw), _row([5, 9], [7], **kw), _row([2], [2])]
    pending = [_row([3, 11, -1], [1, 2], **kw), _row([5, -1], [7], **kw), _row([2], [2])]
    pending[0].pending_row, pending[1].pending_row = 1, 2
    want = apply_penalties(logits, known)
    assert torch.equal(apply_penalties(logits, pending, prev_tokens), want)
    assert not torch.equal(apply_penalties(logits, [_row([3, 11], [1, 2], **kw)] + known[1:]), want)


def test_draw_keys_are_the_seeded_hash_and_fresh_bits_from_the_pool():
    """draw_keys: a seeded row's key is seeded_uniforms.row_keys' of (its seed, its outputs
    and drafts), for seeds negative and past 32 bits; an unseeded row's 32 bits come from
    torch's default generator through the sampler's pool, a block at a time: fresh each
    step, and the same again after manual_seed with a new pool."""
    from types import SimpleNamespace

    from common.sampling_params import SamplingParams
    from scheduler_worker.batch_params import values_of
    from scheduler_worker.draws import KeyPool, draw_columns, draw_keys
    from scheduler_worker.seeded_uniforms import M32, row_keys

    seeds = [None, 7, -3, 2**40 + 5, None, 2**63 - 1, None, 0]
    params = [SamplingParams(temperature=0.8, seed=s) for s in seeds]
    params[4] = SamplingParams(temperature=0.0)  # an argmax row: no key
    rows = [
        SimpleNamespace(output_token_ids=[1] * (3 * i), draft_token_ids=[2] * (i % 3))
        for i in range(len(params))
    ]
    draws = [i for i, p in enumerate(params) if p.temperature > 0]
    columns = draw_columns(draws, values_of(params), torch.device("cpu"))

    def keys(pool: KeyPool, steps: int) -> list[list[int]]:
        out = []
        for _ in range(steps):
            out.append(draw_keys(rows, len(draws), columns, pool).tolist())
            for r in rows:
                r.output_token_ids.append(5)  # the next token's
        for r in rows:
            del r.output_token_ids[-steps:]
        return out

    torch.manual_seed(3)
    got = keys(KeyPool(16), 5)  # blocks of 16 keys: a refill every other step
    torch.manual_seed(3)
    assert keys(KeyPool(16), 5) == got
    for step, step_keys in enumerate(got):
        for j, i in enumerate(draws):
            seed, r = seeds[i], rows[i]
            if seed is None:
                continue
            count = len(r.output_token_ids) + step + len(r.draft_token_ids)
            want = row_keys(np.array([[seed & M32, (seed >> 32) & M32, count]], dtype=np.int64))
            assert step_keys[j] == int(want[0]), (step, i)
    unseeded = [k for step_keys in got for j, k in enumerate(step_keys) if seeds[draws[j]] is None]
    assert all(0 <= k < 1 << 32 for k in unseeded) and len(set(unseeded)) == len(unseeded)
