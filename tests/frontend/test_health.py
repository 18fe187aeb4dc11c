"""frontend.health's bookkeeping: which components are alive (Liveness) and which requests
a dead or hung tokenizer worker takes with it (TokenizerHandoffs)."""

from __future__ import annotations

import time

from common.messages import ComponentStatus, EngineStatus, TokenizeAck
from frontend.health import (
    ACK_GRACE_S,
    DISCONNECT_SETTLE_S,
    HealthMonitor,
    Liveness,
    TokenizerHandoffs,
)


def test_requests_move_from_unacked_to_taken_to_forgotten():
    h = TokenizerHandoffs()
    assert not h
    for rid in ("a", "b", "c"):
        h.sent(rid, now=0.0)
    h.on_ack(TokenizeAck(11, ["a", "b"]))
    h.on_ack(TokenizeAck(11, ["a"], done=True))  # a reached the scheduler
    h.on_ack(TokenizeAck(12, ["zzz"]))  # never sent from here: ignored
    assert h.unacked.keys() == {"c"} and h.taken == {"b": 11}
    h.forget("c")  # e.g. its error came back
    assert h.unacked == {} and h.taken == {"b": 11} and h


def test_lost_are_the_stale_unacked_and_what_dead_workers_took():
    h = TokenizerHandoffs()
    h.sent("old", now=0.0)
    h.sent("new", now=10.0)
    h.sent("by11", now=0.0)
    h.sent("by12", now=0.0)
    h.on_ack(TokenizeAck(11, ["by11"]))
    h.on_ack(TokenizeAck(12, ["by12"]))
    now = 10.0 + ACK_GRACE_S / 2
    assert sorted(h.lost(now, dead={11})) == ["by11", "old"]  # "new" is within its grace
    assert h.unacked.keys() == {"new"} and h.taken == {"by12": 12}
    assert h.lost(now, dead={11}) == []  # forgotten once reported
    assert h.lost(now + 1.0) == ["new"]


def test_a_dead_worker_is_reported_once_until_liveness_forgets_it():
    h = TokenizerHandoffs()
    assert h.newly_dead({11, 12}) == {11, 12}
    assert h.newly_dead({11, 12, 13}) == {13}
    h.prune({12, 13})  # liveness pruned 11: a new process may reuse the pid later
    assert h.newly_dead({11, 12}) == {11}


def test_liveness_window():
    live = Liveness(heartbeat_s=0.5)  # window max(3, 1.5) = 3 s
    assert live.missing(0.0) == ["scheduler", "tokenizer", "detok"]
    live.on_component(ComponentStatus("scheduler", 1, "ready", 0.0), 0.0)  # no EngineStatus yet
    live.on_component(ComponentStatus("tokenizer", 7, "ready", 0.0), 0.0)
    live.on_component(ComponentStatus("detok", 2, "ready", 0.0), 0.0)
    assert live.missing(1.0) == ["scheduler"]
    live.on_engine_status(EngineStatus("ready", 0, 0, 0.0, 1, 1, 0, 0, "m", 16, 32, 0.0), 1.0)
    assert live.missing(2.9) == []
    assert live.missing(3.5) == ["tokenizer", "detok"]
    live.on_outputs(3.5)  # a TextOutputs proves the detok (and the scheduler) alive
    assert live.missing(3.6) == ["tokenizer"]
    live.on_component(ComponentStatus("tokenizer", 8, "heartbeat", 0.0), 3.6)
    live.on_component(ComponentStatus("tokenizer", 8, "stopping", 0.0), 3.7)
    assert live.missing(3.8) == ["tokenizer"]


def test_monitor_reports_what_failed():
    """A restarted pid, a silent component and a silent tokenizer's request each reach
    the client's callbacks once."""
    failed: list[tuple[str, str]] = []
    lost: list[tuple[list[str], str]] = []
    m = HealthMonitor(
        0.5,
        lambda name, why: failed.append((name, why)),
        lambda rids, why: lost.append((rids, why)),
        lambda msg: True,
    )
    m.on_component(ComponentStatus("detok", 10, "ready", 0.0), 0.0)
    m.on_component(ComponentStatus("detok", 11, "ready", 0.0), 0.1)
    assert failed == [("detok", "restarted (pid 10 -> 11)")]
    m.on_component(ComponentStatus("tokenizer", 7, "ready", 0.0), 0.1)
    m.handoffs.sent("r", 0.1)
    m.handoffs.on_ack(TokenizeAck(7, ["r"]))
    m.check(1.0)
    assert len(failed) == 1 and lost == []
    m.check(3.5)  # both silent for more than the 3 s window
    assert failed[1:] == [("detok", "stopped responding")]
    assert lost == [(["r"], "tokenizer worker(s) [7] stopped")]
    m.check(3.7)
    m.on_disconnect(["detok"])  # already failed: not again
    assert len(failed) == 2 and len(lost) == 1


def test_a_gone_scheduler_fails_what_it_held_after_its_last_outputs():
    """A scheduler's last outputs travel through the detok, its connection closes directly:
    a disconnect waits DISCONNECT_SETTLE_S before failing what is open, and the "stopping"
    that the scheduler sends through the detok behind its outputs ends the wait at once.
    A replaced scheduler's late "stopping" says nothing about its successor."""
    failed: list[tuple[str, str]] = []
    m = HealthMonitor(
        0.5, lambda name, why: failed.append((name, why)), lambda rids, why: None, lambda msg: True
    )
    t = time.monotonic()
    m.on_component(ComponentStatus("scheduler", 20, "ready", 0.0), t)
    m.liveness.on_engine_status(EngineStatus("ready", 0, 0, 0.0, 1, 1, 0, 0, "m", 16, 32, 0.0), t)
    m.check(t)
    m.on_disconnect(["scheduler"])
    assert "scheduler" in m.liveness.missing()  # /health shows the hole at once
    m.check(time.monotonic())
    assert failed == []  # its last outputs may still come through the detok
    m.check(time.monotonic() + DISCONNECT_SETTLE_S)
    assert failed == [("scheduler", "disconnected")]

    m.on_component(ComponentStatus("scheduler", 21, "ready", 0.0), time.monotonic())
    m.liveness.on_engine_status(
        EngineStatus("ready", 0, 0, 0.0, 1, 1, 0, 0, "m", 16, 32, 0.0), time.monotonic()
    )
    m.check(time.monotonic())
    assert failed[1:] == [("scheduler", "restarted (pid 20 -> 21)")]
    m.on_component(ComponentStatus("scheduler", 20, "stopping", 0.0), time.monotonic())
    assert "scheduler" not in m.liveness.missing() and len(failed) == 2  # stale: ignored
    m.on_disconnect(["scheduler"])
    m.on_component(ComponentStatus("scheduler", 21, "stopping", 0.0), time.monotonic())
    assert failed[2:] == [("scheduler", "stopped")]  # at once, not after the settle time
    m.check(time.monotonic() + DISCONNECT_SETTLE_S)
    assert len(failed) == 3
