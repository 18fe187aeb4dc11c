"""Speculation's switch (scheduler_worker/spec/policy.py): the cost fit, the per-step and
per-row decisions, and what they do in the scheduler."""

from __future__ import annotations

import random

import pytest

from common.sampling_params import SamplingParams
from scheduler_worker.request import Request
from scheduler_worker.scheduled_batch import ScheduledBatch
from scheduler_worker.spec.policy import (
    MARGIN,
    MIN_STEPS,
    NO_CAP,
    PROBE_EVERY,
    PROBE_MAX,
    PROBE_TOKENS,
    SpecPolicy,
    _Fit,
    acceptance,
    bucket,
    verified,
)


def _request(rid: str = "r") -> Request:
    return Request(rid, [1, 2, 3], SamplingParams(max_tokens=64, temperature=0.0))


def _cost(t0: float, c1: float, c2: float):
    return lambda d: t0 + (c1 + c2 * d if d else 0.0)


def _learn(
    policy: SpecPolicy, rows: int, cost, steps: int = 40, caps: list[int] | None = None
) -> list[bool]:
    """Run `steps` steps of `rows` rows whose drafts, when allowed, are 1-4 tokens a row
    (no more than the step's cap); the step's time from `cost(drafts)`. Returns whether
    each step drafted."""
    drafted = []
    for i in range(steps):
        may = policy.start_step(rows)
        d = min((1 + i % 4) * rows, policy.cap) if may else 0
        if may and caps is not None:
            caps.append(policy.cap)
        policy.record(rows, d, cost(d))
        drafted.append(may)
    return drafted


def test_bucket_is_by_powers_of_two():
    assert [bucket(n) for n in (1, 2, 3, 4, 5, 8, 9, 32, 33)] == [0, 1, 2, 2, 3, 3, 4, 5, 6]


def test_fit_recovers_a_linear_cost():
    fit = _Fit()
    cost = _cost(0.010, 0.002, 0.0005)
    for d in (0, 3, 0, 5, 8, 0, 2, 12, 0, 7):
        fit.add(d, cost(d))
    assert fit.ready()
    t0, c1, c2 = fit.solve()
    assert t0 == pytest.approx(0.010, rel=1e-3)
    assert c1 == pytest.approx(0.002, rel=1e-2)
    assert c2 == pytest.approx(0.0005, rel=1e-2)


def test_learning_drafts_and_measures_steps_without():
    policy = SpecPolicy()
    first = _learn(policy, 1, _cost(0.010, 0.001, 0.0003), steps=4 * MIN_STEPS - 3)
    assert first.count(False) == MIN_STEPS  # one in four without, until seen...
    assert not first[0]  # ...the first: the fit's unit
    assert policy.fits[0].ready()


def test_cheap_drafts_stay_on_at_one_row_and_k_follows_acceptance():
    policy = SpecPolicy()
    drafted = _learn(policy, 1, _cost(0.010, 0.001, 0.0003), steps=80)
    assert drafted[-PROBE_EVERY:].count(False) == 1  # the probe without drafts only
    assert policy.start_step(1)
    assert policy.threshold == pytest.approx(0.03 * MARGIN, rel=0.05)
    good, bad = _request("good"), _request("bad")
    for _ in range(10):
        verified(good, 4, 4)
        verified(bad, 4, 0)
    assert acceptance(good) > 0.9 and acceptance(bad) < 0.15
    assert policy.row_tokens(good, 8) == 8
    assert policy.row_tokens(bad, 8) == 1  # near-free drafts: one, even for a poor row
    policy.threshold = 0.3  # a busier step's: a poor row sits out...
    assert policy.row_tokens(bad, 8) == 0
    for _ in range(60):
        policy.row_tokens(bad, 8)
    assert policy.row_tokens(bad, 8) > 0  # ...and drifts back to the prior, to retry
    assert policy.row_tokens(good, 8) == 8


def test_costly_drafts_switch_off_but_for_the_probes():
    # a step of 32 rows: 32 ms; a draft token 1.5 ms (compute-bound: a row's share is 1 ms)
    policy = SpecPolicy()
    _learn(policy, 32, _cost(0.032, 0.002, 0.0015), steps=2 * PROBE_EVERY)
    drafted = _learn(policy, 32, _cost(0.032, 0.002, 0.0015), steps=4 * PROBE_EVERY)
    assert 1 <= drafted.count(True) <= 3  # probes, ever sparser while drafts do not pay
    assert policy.num_switched_off > 0
    # a smaller batch of the same model may still pay: its own bucket, its own fit
    assert bucket(1) not in policy.fits


def test_probes_are_small_and_back_off_while_drafts_do_not_pay():
    policy = SpecPolicy()
    costly, cheap = _cost(0.032, 0.002, 0.0015), _cost(0.032, 0.0, 0.00001)
    caps: list[int] = []
    drafted = _learn(policy, 32, costly, steps=2 * PROBE_MAX, caps=caps)
    assert policy.fits[bucket(32)].probe_every == PROBE_MAX
    late = drafted[PROBE_MAX:]
    assert 1 <= late.count(True) <= 2  # one probe in PROBE_MAX steps once backed off
    # every step that learnt or probed drafted PROBE_TOKENS tokens at most, not 32 rows' k
    assert len(caps) == drafted.count(True) and max(caps) == PROBE_TOKENS
    assert min(caps) == PROBE_TOKENS // 2  # alternately half: c1 and c2 part
    # the costs drop (the load changed): a probe finds it within PROBE_MAX steps, the
    # bucket drafts again and probes every PROBE_EVERY steps
    drafted = _learn(policy, 32, cheap, steps=PROBE_MAX + 8 * PROBE_EVERY)
    assert drafted[-PROBE_EVERY:].count(True) >= PROBE_EVERY - 2
    assert policy.fits[bucket(32)].probe_every == PROBE_EVERY


def test_costs_probed_under_one_load_are_not_read_against_another():
    # 8 rows where drafts do not pay (threshold 1.1 * 2.5 * 8 / 16 > 1); then the host
    # gets busier and every step takes twice as long, drafted or not: still off
    policy = SpecPolicy()
    _learn(policy, 8, _cost(0.016, 0.0, 0.0025), steps=4 * PROBE_EVERY)
    busier = _learn(policy, 8, _cost(0.032, 0.0, 0.005), steps=4 * PROBE_EVERY)
    assert busier.count(True) <= 2  # the probes (was: drafting once T0 had moved)
    t0, _, c2 = policy.fits[bucket(8)].solve()
    assert t0 == pytest.approx(0.032, rel=0.05) and c2 == pytest.approx(0.005, rel=0.25)


def _stalled(c2: float, seed: int, steps: int = 1200, after: int = 200) -> int:
    """8 rows, a plain step 16 ms and c2 a draft token, 3% of steps stalled 2-6x by the
    host (any step, drafted or not): the steps past `after` the fit let draft (not probes)."""
    rng, policy, n = random.Random(seed), SpecPolicy(), 0
    for i in range(steps):
        may = policy.start_step(8)
        d = min((1 + i % 4) * 8, policy.cap) if may else 0
        t = 0.016 + c2 * d
        policy.record(8, d, t * rng.uniform(2, 6) if rng.random() < 0.03 else t)
        n += i >= after and may and policy.cap == NO_CAP
    return n


def test_a_stalled_step_moves_the_fit_little():
    # costly (threshold 1.1 * 2.5 * 8 / 16 = 1.4): off, the old fit drafted in up to 32
    # steps after a stalled plain step; cheap (0.8): on in every step but the probes'
    # (937), the old fit in 22-535 after a stalled probe
    assert max(_stalled(0.0025, seed) for seed in range(1, 9)) <= 2
    assert min(_stalled(0.0015, seed) for seed in range(1, 9)) >= 900


def test_settle_drops_drafts_that_cannot_pay_their_fixed_cost():
    policy = SpecPolicy()
    # drafting at all costs 10 ms, a token nothing: one doubtful draft cannot pay that
    _learn(policy, 1, _cost(0.010, 0.010, 0.0), steps=2 * PROBE_EVERY)
    assert policy.start_step(1) and policy.costs is not None
    req = _request()
    batch = ScheduledBatch(entries={"r": (req, 3)}, num_decode=1, drafts={"r": [5, 6]})
    policy.settle(batch)
    assert batch.drafts == {} and batch.entries["r"] == (req, 1)
    for _ in range(20):  # a row that is always right pays for it
        verified(req, 8, 8)
    batch = ScheduledBatch(entries={"r": (req, 9)}, num_decode=1, drafts={"r": [5] * 8})
    policy.settle(batch)
    assert batch.drafts == {"r": [5] * 8}


def test_a_row_whose_drafts_settle_drops_retries():
    # one row, as measured at one stream: a verify's fixed cost half a step, a token 1%
    policy = SpecPolicy()
    _learn(policy, 1, _cost(0.020, 0.010, 0.0002), steps=2 * PROBE_EVERY)
    req = _request()
    for _ in range(5):  # a poor patch: its drafts cannot pay the verify's fixed cost
        verified(req, 4, 0)
    kept = []
    policy.costs = policy.fits[0].solve()  # a deciding step's (not a probe's)
    for _ in range(60):
        batch = ScheduledBatch(entries={"r": (req, 5)}, num_decode=1, drafts={"r": [5] * 4})
        policy.settle(batch)
        kept.append(bool(batch.drafts))
    assert not kept[0] and any(kept)  # dropped at first, then drafted again


def test_always_policy_never_measures_or_refuses():
    policy = SpecPolicy("always")
    drafted = _learn(policy, 32, _cost(0.032, 0.002, 0.0015), steps=2 * PROBE_EVERY)
    assert all(drafted) and not policy.fits
    assert policy.row_tokens(_request(), 5) == 5


def _engine_run(llama, policy: str, draft_cost: float):
    """8 repetitive prompts through an ngram engine whose decode steps are timed by a
    stand-in clock: 8 ms a step, 2 ms to verify at all, `draft_cost` a draft token.
    Returns the outputs, the counters and the draft count of each step of 8 rows."""
    from tests.scheduler_worker.test_engine import make_engine, run_staggered
    from tests.scheduler_worker.test_spec_ngram import _repetitive

    engine = make_engine(
        llama, speculative_method="ngram", num_speculative_tokens=4, speculative_policy=policy
    )
    real, steps = engine.scheduler.policy.record, []
    clock = _cost(0.008, 0.002, draft_cost)

    def record(rows: int, d: int, seconds: float) -> None:
        if rows == 8:  # all rows running (not the start's, nor the end's smaller buckets)
            steps.append(d)
        real(rows, d, clock(d))

    engine.scheduler.policy.record = record  # type: ignore[method-assign]
    params = SamplingParams(max_tokens=200, temperature=0.0, ignore_eos=True)
    outs = run_staggered(engine, _repetitive(8, seed=3), params, every=1)
    return outs, engine.counters, steps


@pytest.mark.timeout(900)
def test_engine_switches_costly_drafts_off_and_keeps_cheap_ones(tiny_model_dirs):
    llama = tiny_model_dirs["llama"]
    always, c_always, _ = _engine_run(llama, "always", 0.004)
    costly, _, s_costly = _engine_run(llama, "adaptive", 0.004)
    cheap, c_cheap, s_cheap = _engine_run(llama, "adaptive", 0.0001)
    assert always == costly == cheap  # the switch changes the speed, never the tokens
    assert c_always.accepted_tokens > 0
    # a draft token at half a step's cost: once learnt, the steps draft only to probe
    late = s_costly[len(s_costly) // 2 :]
    assert sum(d > 0 for d in late) <= len(late) / PROBE_EVERY + 1
    # nearly free drafts: the rows keep drafting where they are accepted
    late = s_cheap[len(s_cheap) // 2 :]
    assert sum(d > 0 for d in late) >= len(late) / 2
    assert c_cheap.accepted_tokens > c_always.accepted_tokens / 2
