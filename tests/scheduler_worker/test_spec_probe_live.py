"""A probe of the speculation policy (spec/policy.py) drafts with a draft model only for
rows whose draft sequence is live: a row's first proposal runs its whole prompt through
the draft model, a cost a model-free probe does not have (issue 53, item 4)."""

from __future__ import annotations

from pathlib import Path

from common.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from common.sampling_params import SamplingParams
from scheduler_worker.engine import LLMEngine
from scheduler_worker.spec import propose
from scheduler_worker.spec.draft_model import DraftModelDrafter
from scheduler_worker.spec.drafter import RESERVED
from scheduler_worker.spec.policy import MIN_STEPS, NO_CAP, PROBE_EVERY, SpecPolicy, bucket
from tests.scheduler_worker.test_engine import run_staggered
from tests.scheduler_worker.test_spec_draft_batched import perturbed_llama_dir  # noqa: F401
from tests.scheduler_worker.test_spec_ngram import _repetitive


def _cost(t0: float, c1: float, c2: float):
    return lambda d: t0 + (c1 + c2 * d if d else 0.0)


def test_probing_is_a_ready_buckets_probe_only():
    policy, cost, seen = SpecPolicy(), _cost(0.008, 0.002, 0.004), []
    for _ in range(3 * PROBE_EVERY):
        learning = not policy.fits.get(bucket(4)) or not policy.fits[bucket(4)].ready()
        may = policy.start_step(4)
        seen.append((learning, may, policy.cap < NO_CAP, policy.probing))
        policy.record(4, min(8, policy.cap) if may else 0, cost(8 if may else 0))
    assert not any(p for learning, _, _, p in seen if learning)  # learning drafts freely
    probes = [p for learning, may, capped, p in seen if not learning and may and capped]
    assert probes and all(probes)  # switched off (c2 x 4 rows > T0): it drafts to probe only
    assert sum(p for *_, p in seen) == len(probes)
    assert sum(not learning for learning, *_ in seen) > 2 * MIN_STEPS


class _Model(DraftModelDrafter):
    """propose's view of a draft model: live rows by id, no model."""

    def __init__(self, live: set[str]) -> None:
        self.first, self.live_ids = None, live

    def live(self, req) -> bool:
        return req.request_id in self.live_ids


def test_propose_on_a_probe_reserves_live_rows_only():
    from scheduler_worker.request import Request

    params = SamplingParams(max_tokens=8, temperature=0.0)
    warm, cold = Request("warm", [1, 2, 3], params), Request("cold", [1, 2, 3], params)
    drafter = _Model({"warm"})
    assert propose(warm, drafter, 3, probing=True) == [RESERVED] * 3
    assert propose(cold, drafter, 3, probing=True) == []
    assert propose(cold, drafter, 3) == [RESERVED] * 3  # the fit allows drafts: any row


def test_probes_skip_rows_without_a_draft_sequence(tiny_model_dirs, perturbed_llama_dir: Path):  # noqa: F811
    """Drafts at half a step's cost a token switch a 4-row bucket off once learnt; rows
    admitted later have no draft sequence, and its probes must not start one for them."""
    target = tiny_model_dirs["llama"]
    engine = LLMEngine(
        EngineConfig(
            model=ModelConfig(model=str(target), dtype="float32"),
            cache=CacheConfig(num_blocks=512, block_size=16),
            scheduler=SchedulerConfig(
                max_num_seqs=4, speculative_model=str(perturbed_llama_dir), num_speculative_tokens=3
            ),
        ),
        target,
    )
    policy, drafter = engine.scheduler.policy, engine.scheduler.drafter
    assert isinstance(drafter, DraftModelDrafter)
    clock, seen = _cost(0.008, 0.002, 0.004), {"probe": False, "cold": 0, "bad": 0, "rows": 0}
    real_record, real_start, real_batch = policy.record, policy.start_step, drafter.propose_batch

    def record(rows: int, d: int, seconds: float) -> None:
        real_record(rows, d, clock(d))

    def start_step(num_rows: int) -> bool:  # a probe told apart as the policy does
        fit = policy.fits.get(bucket(num_rows))
        ready = fit is not None and fit.ready()
        may = real_start(num_rows)
        seen["probe"] = may and ready and policy.cap < NO_CAP
        if seen["probe"]:
            rows = [r for r, _ in engine.scheduler.active.values()]
            seen["cold"] += sum(r.request_id not in drafter.kv.seqs for r in rows)
        return may

    def propose_batch(rows):
        if seen["probe"]:
            seen["bad"] += sum(r.request_id not in drafter.kv.seqs for r, _ in rows)
            seen["rows"] += len(rows)
        return real_batch(rows)

    policy.record, policy.start_step = record, start_step  # type: ignore[method-assign]
    drafter.propose_batch = propose_batch  # type: ignore[method-assign]
    params = SamplingParams(max_tokens=48, temperature=0.0, ignore_eos=True)
    outs = run_staggered(engine, _repetitive(16, seed=5), params, every=6)
    assert all(len(o) == 48 for o in outs)
    assert drafter.num_forwards > 0  # the draft model drafted while the fit learnt
    assert seen["cold"] > 0  # probes met rows without a draft sequence...
    assert seen["bad"] == 0  # ...and drafted for none of them
    assert not drafter.kv.seqs  # every draft sequence dropped with its row
    drafter.kv.check()
