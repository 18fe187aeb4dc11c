"""The scheduler's status beats (EngineStatus): the frontends' engine figures in /metrics
(the busy split, running, KV) come from them.

- Once the engine goes idle, a beat follows within IDLE_BEAT_MS, so the figures are those
  of the finished run and not of a beat up to heartbeat_s before its end. The GPU check
  read its "GPU busy" from /metrics right after each level; with 1 s beats it missed up to
  a second of a level's forwards (benchmarks/gpu/bench.py).
- The memory figures (mincore, /proc/self/maps: milliseconds) are measured at the first
  beat once idle, then at most every heartbeat_s while idle and every MEMORY_BUSY_S while
  the engine serves.
"""

from __future__ import annotations

import dataclasses
import time
from types import SimpleNamespace

import pytest
import torch

from common.messages import AbortRequest, EngineStatus, GenerateRequest, StepOutputs, pack_ids
from common.sampling_params import SamplingParams
from common.zmq_queue import PushQueue
from scheduler_worker.backends.cpu import CpuBackend
from scheduler_worker.engine_status import placement_text
from scheduler_worker.quant.linear import StepRows
from tests.garbage import collect, make_config, running, scheduler_under_test, sockets

pytestmark = pytest.mark.timeout(90)

HEARTBEAT_S = 10.0  # long: the runs' beats must come before the first periodic one


def _finished(rid: str):
    def done(msgs) -> bool:
        return any(
            isinstance(m, StepOutputs)
            and rid in m.rids
            and m.finish_reasons is not None
            and m.finish_reasons[m.rids.index(rid)] is not None
            for m in msgs
        )

    return done


def test_a_beat_follows_the_end_of_a_run_not_the_next_heartbeat(run_dir, tiny_llama_dir):
    """Every run ends, and its beat comes, before the first periodic beat is due
    (heartbeat_s after "ready"): without the beat at idle the only status would be
    "ready", with nothing in the busy split. A run of one token is one pass of the loop
    (the request admitted and stepped to its end in it)."""
    config = dataclasses.replace(make_config(run_dir, tiny_llama_dir), heartbeat_s=HEARTBEAT_S)
    worker, frontend, detok = scheduler_under_test(config, tiny_llama_dir)
    push = PushQueue(config.ipc.endpoint("scheduler"), bind=False)
    with sockets(frontend, detok, push), running(worker) as thread:

        def ready(msgs) -> bool:
            return any(isinstance(m, EngineStatus) and m.kind == "ready" for m in msgs)

        def idle_status(msgs) -> bool:
            return any(
                isinstance(m, EngineStatus) and m.kind == "heartbeat" and m.num_running == 0
                for m in msgs
            )

        collect(frontend, ready, thread)
        periodic_due = time.monotonic() + HEARTBEAT_S
        forward = 0.0
        for i, max_tokens in enumerate((1, 8, 8)):
            rid = f"run-{i}"
            params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
            push.put(GenerateRequest(rid, pack_ids([1, 2, 3, 4]), params, time.time()))
            collect(detok, _finished(rid), thread)
            got = collect(frontend, idle_status, thread, timeout_s=HEARTBEAT_S)
            assert time.monotonic() < periodic_due, "the beat came with the periodic one"
            last = [m for m in got if isinstance(m, EngineStatus)][-1]
            assert last.num_running == 0 and last.num_waiting == 0
            assert (last.device, last.gpus) == ("cpu", [])  # where it runs (a GPU: its id)
            assert last.busy["forward"] > forward  # this run's steps are in it
            forward = last.busy["forward"]
            # the counters are those of the whole run: no step after this beat
            assert last.busy == worker.busy_split()
        # stop at once, not after the loop's wait on its inbox (up to heartbeat_s): a
        # second stop ends the drain, a message wakes the loop
        worker.stop()
        worker.stop()
        push.put(AbortRequest("wake-up", "test"))


def test_memory_figures_are_measured_while_idle_and_seldom_while_serving(
    run_dir, tiny_llama_dir, monkeypatch
):
    """At beats while serving, the last measure until it is MEMORY_BUSY_S old; at the
    first beat once idle, a new one; at idle beats after it, that one for heartbeat_s."""
    from scheduler_worker import engine_status as status_module
    from scheduler_worker.engine_status import MEMORY_BUSY_S

    config = make_config(run_dir, tiny_llama_dir)
    worker, frontend, detok = scheduler_under_test(config, tiny_llama_dir)
    engine = worker.engine
    calls: list[float] = []
    real = status_module.memory_figures
    monkeypatch.setattr(
        status_module, "memory_figures", lambda kv: (calls.append(clock[0]), real(kv))[1]
    )
    clock = [1000.0]  # the cadence's clock only (collect() keeps the real one)
    fake_time = SimpleNamespace(
        monotonic=lambda: clock[0], time=time.time, perf_counter=time.perf_counter
    )
    monkeypatch.setattr(status_module, "time", fake_time)
    params = SamplingParams(max_tokens=50, temperature=0.0, ignore_eos=True)
    with sockets(frontend, detok, worker.inbox, worker.to_detok, worker.to_frontend):
        worker.heartbeat()
        worker.heartbeat()
        assert len(calls) == 1  # idle: measured, then kept for heartbeat_s
        clock[0] += config.heartbeat_s
        worker.heartbeat()
        assert len(calls) == 2
        engine.add_request("r", [1, 2, 3], params)
        first = worker.memory.figures()
        for _ in range(5):
            clock[0] += 1.0
            worker.heartbeat()
        assert len(calls) == 2 and worker.memory.figures() is first  # serving: the last measure
        clock[0] += MEMORY_BUSY_S
        worker.heartbeat()
        assert len(calls) == 3  # and again once it is MEMORY_BUSY_S old
        engine.abort("r")
        worker.publish(engine.step_rows())  # the abort's output: nothing unfinished after it
        assert not engine.has_unfinished()
        worker.heartbeat()
        assert len(calls) == 4  # the first beat once idle measures
        worker.heartbeat()
        assert len(calls) == 4
        got = collect(frontend, lambda ms: sum(isinstance(m, EngineStatus) for m in ms) >= 10)
    statuses = [m for m in got if isinstance(m, EngineStatus)]
    assert all("resident_bytes" in m.memory for m in statuses)


def test_a_replica_names_where_it_runs():
    """Its beats' device and gpus, and its "engine ready" log line: "on cpu", or "on GPU 2
    (NVIDIA H200)" (the id as launch.py placed it: common/gpus.py)."""
    assert CpuBackend(torch.float32, 16, None, StepRows()).placement() == ("cpu", [])
    assert placement_text("cpu", []) == "cpu"
    assert placement_text("NVIDIA H200", ["2"]) == "GPU 2 (NVIDIA H200)"
    assert placement_text("NVIDIA H200", ["0", "1"]) == "GPU 0,1 (NVIDIA H200)"
