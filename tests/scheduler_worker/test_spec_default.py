"""The default speculative method, auto: ngram where the engine runs on a CPU, none on
CUDA; an explicit method is kept, a draft model alone means draft, and wherever the method
is reported (the engine's scheduler config, its status beats, /metrics) it is the resolved
one, never "auto"."""

from __future__ import annotations

import random

import pytest

from common.cli import parse_config
from common.config import SchedulerConfig
from common.sampling_params import SamplingParams
from common.spec_config import resolved_method
from scheduler_worker.engine_status import engine_status
from scheduler_worker.spec.ngram import NgramDrafter
from tests.scheduler_worker.test_engine import make_engine


@pytest.mark.parametrize(
    ("method", "device", "want"),
    [
        ("auto", "cpu", "ngram"),
        ("auto", "cuda", "none"),
        ("none", "cpu", "none"),
        ("ngram", "cuda", "ngram"),
        ("suffix", "cpu", "suffix"),
        ("suffix", "cuda", "suffix"),
    ],
)
def test_resolution_by_device(method, device, want):
    assert resolved_method(method, device) == want
    assert SchedulerConfig(speculative_method=method).resolved(device).speculative_method == want


def test_auto_is_the_default_and_a_draft_model_alone_means_draft():
    assert SchedulerConfig().speculative_method == "auto"
    assert parse_config("t", []).engine.scheduler.speculative_method == "auto"
    cfg = parse_config("t", ["--speculative-model", "/models/draft.gguf"]).engine.scheduler
    assert cfg.speculative_method == "draft"
    for device in ("cpu", "cuda"):  # resolving keeps it: the draft model drafts on both
        assert cfg.resolved(device).speculative_method == "draft"
    explicit = parse_config("t", ["--speculative-method", "none"]).engine.scheduler
    assert explicit.resolved("cpu").speculative_method == "none"


@pytest.fixture(scope="module")
def llama(tiny_model_dirs):
    return tiny_model_dirs["llama"]


def _repetitive(n: int, seed: int) -> list[list[int]]:
    """Prompts that repeat a phrase, so that prompt lookup finds matches."""
    rng = random.Random(seed)
    phrase = [rng.randrange(3, 200) for _ in range(6)]
    return [phrase * 4 + [rng.randrange(3, 200)] + phrase for _ in range(n)]


def _status(engine):
    return engine_status("heartbeat", engine, _Cfg(), {}, {}, "ipc://x", None, ("cpu", []))


class _Cfg:  # the fields of Config that engine_status reads
    model_name = "tiny"
    replica_id = 0


def test_cpu_engine_drafts_by_default_and_reports_ngram(llama):
    engine = make_engine(llama, speculative_policy="always")
    assert engine.config.scheduler.speculative_method == "auto"
    assert engine.scheduler.config.speculative_method == "ngram"
    assert isinstance(engine.scheduler.drafter, NgramDrafter)
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    for i, prompt in enumerate(_repetitive(2, seed=7)):
        engine.add_request(f"r{i}", prompt, params)
    while engine.has_unfinished():
        engine.step()
    assert engine.counters.draft_tokens > 0 and engine.counters.verify_steps > 0
    status = _status(engine)
    assert status.spec_method == "ngram"
    assert status.spec["draft_tokens"] == engine.counters.draft_tokens


def test_explicit_none_on_the_cpu_drafts_nothing_and_reports_nothing(llama):
    engine = make_engine(llama, speculative_method="none")
    assert engine.scheduler.drafter is None
    engine.add_request("r0", _repetitive(1, seed=7)[0], SamplingParams(max_tokens=16))
    while engine.has_unfinished():
        engine.step()
    assert engine.counters.draft_tokens == 0
    status = _status(engine)
    assert status.spec_method == "" and status.spec == {}


class _Repeat(NgramDrafter):
    """ngram's drafts, else the last token k times: a sampled row of random weights
    repeats little, and the test needs its "on" row to draft."""

    def propose(self, token_ids, state, k):
        drafts, state = super().propose(token_ids, state, k)
        return drafts or [token_ids[-1]] * k, state


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_a_request_turns_the_default_off(llama, temperature):
    engine = make_engine(llama, speculative_policy="always")
    assert isinstance(engine.scheduler.drafter, NgramDrafter)
    engine.scheduler.drafter = _Repeat()
    off = SamplingParams(
        max_tokens=24, temperature=temperature, seed=1, ignore_eos=True, speculative=False
    )
    on = SamplingParams(max_tokens=24, temperature=temperature, seed=1, ignore_eos=True)
    prompts = _repetitive(2, seed=9)
    engine.add_request("off", prompts[0], off)
    engine.add_request("on", prompts[1], on)
    outputs = []
    while engine.has_unfinished():
        outputs += engine.step()
    drafted = {
        o.request_id: o.stage_times.get("num_draft_tokens", 0) for o in outputs if o.finish_reason
    }
    assert drafted["off"] == 0 and drafted["on"] > 0
