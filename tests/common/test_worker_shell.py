"""The worker shell over real ZeroMQ sockets: the inbox loop hands every message to the
worker (a failing one costs only itself), says "ready" first and "stopping" last, beats
from the loop or leaves it to the thread, drains after the first stop() until the inbox
falls quiet (or the deadline), stops at once on the second, and closes every socket it
holds, the per-replica ones included."""

from __future__ import annotations

import threading
import time

import pytest

from common.config import Config, IPCConfig, ServerConfig
from common.messages import AbortRequest, ComponentStatus
from common.worker_shell import Drain, ReplicaSockets, WorkerShell
from common.zmq_queue import PullQueue, PushQueue

pytestmark = pytest.mark.timeout(60)


def make_shell(run_dir, *, beacon=False, quiet_s=0.3, drain_timeout_s=10.0, heartbeat_s=0.1):
    config = Config(
        ipc=IPCConfig(run_dir=str(run_dir)),
        heartbeat_s=heartbeat_s,
        server=ServerConfig(drain_timeout_s=drain_timeout_s),
    )
    statuses: list[str] = []
    inbox = PullQueue(config.ipc.endpoint("detok"), bind=True)
    shell = WorkerShell(config, "test", inbox, statuses.append, beacon=beacon, quiet_s=quiet_s)
    return config, shell, statuses


class Harness:
    """shell.run(handle) in a thread, a PUSH into its inbox, the frontend's PULL."""

    def __init__(self, run_dir, fail_on: str | None = None, **kw) -> None:
        self.config, self.shell, self.statuses = make_shell(run_dir, **kw)
        self.frontend = PullQueue(self.config.ipc.endpoint("frontend"), bind=True)
        self.push = PushQueue(self.config.ipc.endpoint("detok"), bind=False)
        self.handled: list[str] = []
        self.fail_on = fail_on
        self.busy = False
        self.thread = threading.Thread(
            target=self.shell.run, args=(self.handle, lambda: self.busy), daemon=True
        )

    def handle(self, msg) -> None:
        if msg.rid == self.fail_on:
            raise RuntimeError("a bug in the worker's handling")
        self.handled.append(msg.rid)

    def send(self, *rids: str) -> None:
        for rid in rids:
            self.push.put(AbortRequest(rid, "test"), timeout_ms=1000)

    def wait_handled(self, n: int, timeout_s: float = 10.0) -> None:
        deadline = time.monotonic() + timeout_s
        while len(self.handled) < n:
            assert time.monotonic() < deadline, f"handled {self.handled}, wanted {n}"
            time.sleep(0.01)

    def __enter__(self) -> Harness:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.shell.stop()
        self.shell.stop()
        self.thread.join(timeout=10)
        self.push.close()
        self.frontend.close()
        assert not self.thread.is_alive()


def test_drain_goes_on_while_messages_arrive_or_busy_until_the_deadline(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(time, "monotonic", lambda: now[0])
    d = Drain(timeout_s=10.0, quiet_s=1.0)
    assert d.running
    assert d.stop() is True and not d.running
    assert d.draining()  # the quiet period counts from the signal
    now[0] = 100.9
    d.touch()  # a message came: quiet again from here
    now[0] = 101.8
    assert d.draining() and d.draining(busy=True)
    now[0] = 102.0
    assert not d.draining() and d.draining(busy=True)  # quiet, but requests still run
    now[0] = 110.0
    assert not d.draining(busy=True)  # the deadline ends even a busy drain
    d2 = Drain(timeout_s=10.0, quiet_s=5.0)
    d2.stop()
    assert d2.draining(busy=True)
    assert d2.stop() is False  # the second signal: stop now
    assert not d2.draining(busy=True) and not d2.running


def test_replica_sockets_are_made_once_per_endpoint_and_all_closed(run_dir):
    sockets = ReplicaSockets()
    a = sockets.get(f"ipc://{run_dir}/a")
    b = sockets.get(f"ipc://{run_dir}/b")
    assert sockets.get(f"ipc://{run_dir}/a") is a and a is not b and len(sockets) == 2
    with pytest.raises(ValueError):
        sockets.get("no endpoint")
    assert len(sockets) == 2
    sockets.close()
    assert a.socket.closed and b.socket.closed and len(sockets) == 0
    c = sockets.get(f"ipc://{run_dir}/a")  # after close: a new one, on demand
    assert c is not a and not c.socket.closed
    sockets.close()


def test_the_loop_hands_over_every_message_and_survives_a_failing_one(run_dir):
    with Harness(run_dir, fail_on="bad") as h:
        h.send("a", "bad", "b")
        h.wait_handled(2)
        replica = h.shell.replicas.get(f"ipc://{run_dir}/replica")
        owned = h.shell.own(PushQueue(f"ipc://{run_dir}/other", bind=False))
        assert h.thread.is_alive()
    assert h.handled == ["a", "b"]
    assert h.statuses[0] == "ready" and h.statuses[-1] == "stopping"
    for q in (h.shell.inbox, *h.shell.to_frontend.queues, replica, owned):
        assert q.socket.closed


def test_the_loop_beats_while_idle_unless_a_thread_does(run_dir):
    with Harness(run_dir, heartbeat_s=0.05) as h:
        time.sleep(0.5)
    assert h.statuses.count("heartbeat") >= 3
    with Harness(run_dir, beacon=True, heartbeat_s=0.05) as h:
        time.sleep(0.3)
        beats = []
        while len(beats) < 2:  # the thread's ComponentStatus beats reach the frontend
            beats += [m for m in h.frontend.get_batch(timeout_ms=2000) if m.kind == "heartbeat"]
        assert all(isinstance(m, ComponentStatus) and m.component == "test" for m in beats)
    assert h.statuses == ["ready", "stopping"]  # nothing from the loop itself


def test_after_stop_messages_still_on_their_way_are_handled_then_it_stops(run_dir):
    h = Harness(run_dir, quiet_s=0.5)
    with h:
        h.send("before")
        h.wait_handled(1)
        h.shell.stop()  # the first signal: drain
        time.sleep(0.2)
        assert h.thread.is_alive()
        h.send("late")  # accepted by the frontend just before it began to drain
        h.wait_handled(2)
        t0 = time.monotonic()
        h.thread.join(timeout=5)
        assert not h.thread.is_alive()  # quiet for quiet_s: the loop ended by itself
        assert time.monotonic() - t0 < 2.0
    assert h.handled == ["before", "late"] and h.statuses[-1] == "stopping"


def test_a_second_stop_ends_the_drain_at_once(run_dir):
    with Harness(run_dir, quiet_s=30.0) as h:
        h.shell.stop()
        time.sleep(0.3)
        assert h.thread.is_alive()  # draining: 30 s of quiet wanted
        t0 = time.monotonic()
        h.shell.stop()
        h.thread.join(timeout=5)
        assert not h.thread.is_alive() and time.monotonic() - t0 < 1.0


def test_the_drain_deadline_ends_a_drain_that_never_falls_quiet(run_dir):
    with Harness(run_dir, quiet_s=30.0, drain_timeout_s=0.5) as h:
        h.shell.stop()
        t0 = time.monotonic()
        h.thread.join(timeout=5)
        assert not h.thread.is_alive()
        assert 0.4 < time.monotonic() - t0 < 2.0


def test_a_busy_worker_drains_past_the_quiet_period(run_dir):
    with Harness(run_dir, quiet_s=0.1) as h:
        h.busy = True  # e.g. the detok: a replica still steps
        h.shell.stop()
        time.sleep(0.5)
        assert h.thread.is_alive()
        h.busy = False
        h.thread.join(timeout=5)
        assert not h.thread.is_alive()


def test_start_freezes_what_start_up_built_out_of_the_collector(run_dir):
    """A full collection in a served worker walked every object start-up made (the
    scheduler: ~390k, a 250 ms pause of every stream); once ready they are frozen."""
    import gc

    gc.unfreeze()
    config, shell, statuses = make_shell(run_dir)
    frontend = PullQueue(config.ipc.endpoint("frontend"), bind=True)
    try:
        before = len(gc.get_objects())
        shell.start()
        assert statuses == ["ready"]
        assert gc.get_freeze_count() >= before // 2 > 0
        assert len(gc.get_objects()) < before // 10
    finally:
        gc.unfreeze()
        shell.finish()
        frontend.close()
