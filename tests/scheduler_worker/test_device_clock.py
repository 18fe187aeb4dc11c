"""The GPU's own account (backends/device_clock.py) on a simulated stream: each event takes
the device's time when the stream reaches it; forwards run in launch order, each as soon
as the host has launched it and the device has finished the one before. The clock adds a
forward only once the device has passed it, and counts the gap before a forward only when
the engine launched it with the previous one still in flight (chained)."""

from __future__ import annotations

import pytest

from common.sampling_params import SamplingParams
from scheduler_worker.backends.device_clock import DeviceClock
from tests.scheduler_worker.test_engine import _prompts, make_engine


class Stream:
    """host: the host's clock; free_at: when the device finishes what it was given."""

    def __init__(self) -> None:
        self.host = 0.0
        self.free_at = 0.0

    def event(self) -> Event:
        return Event(self)

    def forward(self, clock: DeviceClock, chained: bool, seconds: float) -> None:
        started = clock.start(chained)
        self.free_at += seconds  # the kernels, queued behind the start event
        clock.end(started)


class Event:
    def __init__(self, stream: Stream) -> None:
        self.stream, self.at = stream, None

    def record(self) -> None:  # reached when the device is free and the host has launched
        s = self.stream
        s.free_at = max(s.free_at, s.host)
        self.at = s.free_at

    def query(self) -> bool:
        return self.at is not None and self.at <= self.stream.host

    def elapsed_time(self, later: Event) -> float:  # milliseconds, as torch's
        assert self.at is not None and later.at is not None
        return (later.at - self.at) * 1000.0


def test_busy_time_and_the_waits_between_chained_forwards():
    s = Stream()
    clock = DeviceClock(s.event)
    s.forward(clock, chained=False, seconds=1.0)  # 0 -> 1
    s.host = 0.5
    s.forward(clock, chained=True, seconds=1.0)  # launched in time: 1 -> 2, no gap
    assert (clock.busy_s, clock.steps) == (0.0, 0)  # nothing passed yet: never waited on
    s.host = 2.5
    s.forward(clock, chained=True, seconds=1.0)  # the host late by 0.5: 2.5 -> 3.5
    assert clock.steps == 2 and clock.busy_s == pytest.approx(2.0) and clock.wait_s == 0
    s.host = 10.0  # the engine had nothing to run: an unchained forward, its gap not counted
    s.forward(clock, chained=False, seconds=1.0)  # 10 -> 11
    s.host = 12.0
    clock.collect()
    assert clock.steps == 4
    assert clock.busy_s == pytest.approx(4.0)
    assert clock.wait_s == pytest.approx(0.5)


def test_the_engine_chains_a_step_launched_with_one_in_flight(tiny_model_dirs):
    """LLMEngine sets Backend.chained before each forward: in an overlapped run every step
    after the first while requests run (none drafts: a step that does runs alone,
    test_spec_overlap.py); never in a synchronous one."""
    for mode, want_chained in (("on", True), ("off", False)):
        llama = tiny_model_dirs["llama"]
        engine = make_engine(llama, async_scheduling=mode, speculative_method="none")
        backend = engine.runner.backend
        seen: list[bool] = []
        execute = backend.execute

        def spy(*args, execute=execute, backend=backend, seen=seen, **kw):
            seen.append(backend.chained)
            return execute(*args, **kw)

        backend.execute = spy  # type: ignore[method-assign]
        engine.generate(_prompts(3, seed=2), SamplingParams(max_tokens=6, ignore_eos=True))
        assert seen[0] is False and len(seen) >= 6
        assert all(c == want_chained for c in seen[1:]), (mode, seen)
