"""The scheduler's status beats (EngineStatus): the frontends' engine figures in /metrics
(the busy split, running, KV) come from them.

- Once the engine goes idle, a beat follows within IDLE_BEAT_MS, so the figures are those
  of the finished run and not of a beat up to heartbeat_s before its end. The GPU check
  read its "GPU busy" from /metrics right after each level; with 1 s beats it missed up to
  a second of a level's forwards (benchmarks/gpu/bench.py).
- The memory figures (mincore, /proc/self/maps: milliseconds) are measured at a beat while
  idle, and at most every MEMORY_BUSY_S while the engine serves.
"""

from __future__ import annotations

import dataclasses
import time

import pytest

from common.messages import EngineStatus, GenerateRequest, StepOutputs, pack_ids
from common.sampling_params import SamplingParams
from common.zmq_queue import PushQueue
from tests.garbage import collect, make_config, running, scheduler_under_test, sockets

pytestmark = pytest.mark.timeout(90)

HEARTBEAT_S = 4.0  # the loop's longest wait on its inbox: stopping it takes up to this


def _finished(rid: str):
    def done(msgs) -> bool:
        return any(
            isinstance(m, StepOutputs)
            and rid in m.rids
            and m.finish_reasons[m.rids.index(rid)] is not None
            for m in msgs
        )

    return done


def test_a_beat_follows_the_end_of_a_run_not_the_next_heartbeat(run_dir, tiny_llama_dir):
    """Both runs end, and their beats come, before the first periodic beat is due
    (heartbeat_s after "ready"): without the beat at idle the only status would be
    "ready", with nothing in the busy split."""
    config = dataclasses.replace(make_config(run_dir, tiny_llama_dir), heartbeat_s=HEARTBEAT_S)
    worker, frontend, detok = scheduler_under_test(config, tiny_llama_dir)
    push = PushQueue(config.ipc.endpoint("scheduler"), bind=False)
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    with sockets(frontend, detok, push), running(worker) as thread:

        def ready(msgs) -> bool:
            return any(isinstance(m, EngineStatus) and m.kind == "ready" for m in msgs)

        collect(frontend, ready, thread)
        periodic_due = time.monotonic() + HEARTBEAT_S
        for i in range(2):  # twice: a beat at the end of each run
            rid = f"run-{i}"
            push.put(GenerateRequest(rid, pack_ids([1, 2, 3, 4]), params, time.time()))
            collect(detok, _finished(rid), thread)

            def idle_status(msgs) -> bool:
                return any(
                    isinstance(m, EngineStatus) and m.kind == "heartbeat" and m.num_running == 0
                    for m in msgs
                )

            got = collect(frontend, idle_status, thread, timeout_s=HEARTBEAT_S)
            assert time.monotonic() < periodic_due, "the beat came with the periodic one"
            beats = [m for m in got if isinstance(m, EngineStatus)]
            last = beats[-1]
            assert last.num_running == 0 and last.num_waiting == 0
            assert last.busy["forward"] > 0.0
            # the counters are those of the whole run: no step after this beat
            assert last.busy == worker.busy_split()


def test_memory_figures_are_measured_while_idle_and_seldom_while_serving(
    run_dir, tiny_llama_dir, monkeypatch
):
    from scheduler_worker import worker as worker_module
    from scheduler_worker.worker import MEMORY_BUSY_S

    worker, frontend, detok = scheduler_under_test(
        make_config(run_dir, tiny_llama_dir), tiny_llama_dir
    )
    engine = worker.engine
    calls: list[float] = []
    real = worker_module.memory_figures
    monkeypatch.setattr(
        worker_module, "memory_figures", lambda kv: (calls.append(time.monotonic()), real(kv))[1]
    )
    clock = [1000.0]
    monkeypatch.setattr(worker_module.time, "monotonic", lambda: clock[0])
    params = SamplingParams(max_tokens=50, temperature=0.0, ignore_eos=True)
    with sockets(frontend, detok, worker.inbox, worker.to_detok, worker.to_frontend):
        worker.heartbeat()
        worker.heartbeat()
        assert len(calls) == 2  # idle: every beat measures
        engine.add_request("r", [1, 2, 3], params)
        first = worker._memory()
        for _ in range(5):
            clock[0] += 1.0
            worker.heartbeat()
        assert len(calls) == 2 and worker._memory() is first  # serving: the last measure
        clock[0] += MEMORY_BUSY_S
        worker.heartbeat()
        assert len(calls) == 3  # and again once it is MEMORY_BUSY_S old
        engine.abort("r")
        worker.publish(engine.step())  # the abort's output: nothing unfinished after it
        assert not engine.has_unfinished()
        worker.heartbeat()
        assert len(calls) == 4  # idle again
        got = collect(frontend, lambda ms: sum(isinstance(m, EngineStatus) for m in ms) >= 9)
    statuses = [m for m in got if isinstance(m, EngineStatus)]
    assert all("resident_bytes" in m.memory for m in statuses)
