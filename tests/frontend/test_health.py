"""frontend.cluster's bookkeeping: which components are alive and which requests a dead
or hung tokenizer worker takes with it; `Monitor` plays the client, recording the events
the cluster returns."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from common.messages import ComponentStatus, EngineStatus, Message
from frontend.cluster.health import health_report
from frontend.cluster.members import Event, Joined
from frontend.cluster.table import GUARD_S as DISCONNECT_SETTLE_S
from frontend.cluster.table import PRUNE_AFTER, Cluster


class Monitor(Cluster):
    """The cluster with the client's side: its events reach callbacks."""

    def __init__(
        self,
        heartbeat_s: float,
        fail_component: Callable[[str, str], None],
        fail_lost: Callable[[list[str], str], None],
        send_scheduler: Callable[[Message], bool],
        on_join: Callable[[int, str | None], None] | None = None,
        **kw,
    ) -> None:
        super().__init__(heartbeat_s, **kw)
        self.fail_component, self.fail_lost, self.on_join = fail_component, fail_lost, on_join

    def act(self, events: list[Event] | None) -> bool:
        for ev in events or []:
            if isinstance(ev, Joined):
                if self.on_join is not None:
                    self.on_join(ev.replica, ev.inbox)
            elif ev.rids is not None:
                self.fail_lost(ev.rids, ev.why)
            else:
                self.fail_component(ev.component, ev.why)
        return events is not None

    def on_engine_status(self, msg: EngineStatus, now: float) -> bool:
        return self.act(self.on_status(msg, now))

    def on_component(self, msg: ComponentStatus, now: float) -> None:
        self.act(self.on_status(msg, now))

    def on_disconnect(self, names: list[str], now: float | None = None) -> list[Event]:
        self.act(super().on_disconnect(names, time.monotonic() if now is None else now))
        return []

    def check(self, now: float) -> list[Event]:
        self.act(super().check(now))
        return []


def test_the_frontend_picks_the_tokenizer_and_knows_what_each_holds():
    """The live worker holding the fewest requests, then the least recently picked; none
    while none is live; what a worker holds leaves with its first output, error or abort,
    and what a dead one held is failed, once."""
    lost: list[tuple[list[str], str]] = []
    m = Monitor(0.5, lambda name, why: None, lambda rids, why: lost.append((rids, why)), None)
    assert m.choose_tokenizer(0.0) is None
    for pid in (11, 12):
        m.on_component(ComponentStatus("tokenizer", pid, "ready", 0.0), 0.0)
    picks = []
    for rid in ("a", "b", "c", "d"):
        pid = m.choose_tokenizer(0.1)
        assert pid is not None
        m.sent(rid, pid)
        picks.append(pid)
    assert sorted(picks) == [11, 11, 12, 12] and picks[0] != picks[1]
    m.forget(next(r for r, p in zip("abcd", picks) if p == 11))  # its first output came
    assert m.choose_tokenizer(0.2) == 11  # holds one now, 12 holds two
    assert m.choose_tokenizer(0.2, skip={11}) == 12  # 11's queue was full
    m.on_component(ComponentStatus("tokenizer", 12, "heartbeat", 0.0), 2.0)
    m.check(3.5)  # 11 silent for more than the 3 s window
    held_by_11 = [r for r, p in zip("abcd", picks) if p == 11][1:]
    assert lost == [(held_by_11, "tokenizer worker(s) [11] stopped")]
    assert m.choose_tokenizer(3.5) == 12
    m.check(3.6)
    assert len(lost) == 1


def test_a_dead_worker_is_reported_once_until_liveness_forgets_it():
    lost: list[str] = []
    m = Monitor(0.5, lambda name, why: None, lambda rids, why: lost.append(why), lambda msg: True)
    for pid in (11, 12):
        m.on_component(ComponentStatus("tokenizer", pid, "ready", 0.0), 0.0)
    m.check(4.0)  # both silent for more than the 3 s window
    assert lost == ["tokenizer worker(s) [11, 12] stopped"]
    m.on_component(ComponentStatus("tokenizer", 13, "ready", 0.0), 4.0)
    m.check(8.0)
    assert lost[1:] == ["tokenizer worker(s) [13] stopped"]  # 11 and 12 not again
    later = PRUNE_AFTER * m.window_s + 1.0  # 11 and 12 forgotten: a new process may reuse
    m.check(later)
    m.on_component(ComponentStatus("tokenizer", 11, "ready", 0.0), later)
    m.check(later + 4.0)
    assert lost[2:] == ["tokenizer worker(s) [11] stopped"]


def test_liveness_window():
    live = Cluster(heartbeat_s=0.5)  # window max(3, 1.5) = 3 s
    assert live.missing(0.0) == ["scheduler", "tokenizer", "detok"]
    live.on_status(ComponentStatus("scheduler", 1, "ready", 0.0), 0.0)  # no EngineStatus yet
    live.on_status(ComponentStatus("tokenizer", 7, "ready", 0.0), 0.0)
    live.on_status(ComponentStatus("detok", 2, "ready", 0.0), 0.0)
    assert live.missing(1.0) == ["scheduler"]
    live.on_status(EngineStatus("ready", 0, 0, 0.0, 1, 1, 0, 0, "m", 16, 32, 0.0), 1.0)
    assert live.missing(2.9) == []
    assert live.missing(3.5) == ["tokenizer", "detok"]
    live.on_outputs(3.5, 0)  # a TextOutputs proves the detok (and replica 0) alive
    assert live.missing(3.6) == ["tokenizer"]
    live.on_status(ComponentStatus("tokenizer", 8, "heartbeat", 0.0), 3.6)
    live.on_status(ComponentStatus("tokenizer", 8, "stopping", 0.0), 3.7)
    assert live.missing(3.8) == ["tokenizer"]


def test_monitor_reports_what_failed():
    """A restarted pid, a silent component and a silent tokenizer's request each reach
    the client's callbacks once."""
    failed: list[tuple[str, str]] = []
    lost: list[tuple[list[str], str]] = []
    m = Monitor(
        0.5,
        lambda name, why: failed.append((name, why)),
        lambda rids, why: lost.append((rids, why)),
        lambda msg: True,
    )
    m.on_component(ComponentStatus("detok", 10, "ready", 0.0), 0.0)
    m.on_component(ComponentStatus("detok", 11, "ready", 0.0), 0.1)
    assert failed == [("detok", "restarted (pid 10 -> 11)")]
    m.on_component(ComponentStatus("tokenizer", 7, "ready", 0.0), 0.1)
    m.sent("r", 7)
    m.check(1.0)
    assert len(failed) == 1 and lost == []
    m.check(3.5)  # both silent for more than the 3 s window
    assert failed[1:] == [("detok", "stopped responding")]
    assert lost == [(["r"], "tokenizer worker(s) [7] stopped")]
    m.check(3.7)
    m.on_disconnect(["detok"])  # already failed: not again
    assert len(failed) == 2 and len(lost) == 1


def status(replica: int = 0, pid: int = 20, kind: str = "ready", **kw) -> EngineStatus:
    fields = dict(model="m", inbox=f"ipc:///run/scheduler.{replica}.sock")
    fields.update(kw)
    return EngineStatus(
        kind,
        0,
        0,
        0.0,
        1,
        1,
        0,
        0,
        fields.pop("model"),
        16,
        32,
        0.0,
        replica=replica,
        pid=pid,
        **fields,
    )


def monitor(failed: list, joined: list | None = None, **kw) -> Monitor:
    return Monitor(
        0.5,
        lambda name, why: failed.append((name, why)),
        lambda rids, why: None,
        lambda msg: True,
        on_join=lambda k, inbox: joined.append((k, inbox)) if joined is not None else None,
        **kw,
    )


def test_a_gone_scheduler_fails_what_it_held_after_its_last_outputs():
    """A replica's last outputs travel through the detok, its connection closes directly:
    a disconnect waits DISCONNECT_SETTLE_S before failing what is open, and the "stopping"
    that the replica sends through the detok behind its outputs ends the wait at once.
    A replaced replica's late "stopping" says nothing about its successor."""
    failed: list[tuple[str, str]] = []
    m = monitor(failed)
    t = time.monotonic()
    assert m.on_engine_status(status(pid=20), t)
    m.check(t)
    m.on_disconnect(["scheduler.0"])
    assert "scheduler" in m.missing()  # /health shows the hole at once
    m.check(time.monotonic())
    assert failed == []  # its last outputs may still come through the detok
    m.check(time.monotonic() + DISCONNECT_SETTLE_S)
    assert failed == [("scheduler.0", "disconnected")]

    m.on_engine_status(status(pid=21), time.monotonic())  # restarted at the same inbox
    m.check(time.monotonic())
    assert len(failed) == 1  # the old one's requests failed already, once
    m.on_component(ComponentStatus("scheduler.0", 20, "stopping", 0.0), time.monotonic())
    assert "scheduler" not in m.missing() and len(failed) == 1  # stale: ignored
    m.on_disconnect(["scheduler.0"])
    m.on_component(ComponentStatus("scheduler.0", 21, "stopping", 0.0), time.monotonic())
    assert failed[1:] == [("scheduler.0", "stopped")]  # at once, not after the settle time
    m.check(time.monotonic() + DISCONNECT_SETTLE_S)
    assert len(failed) == 2


def test_a_replica_restarted_before_its_death_was_noticed_fails_what_the_old_one_held():
    failed: list[tuple[str, str]] = []
    m = monitor(failed)
    m.on_engine_status(status(pid=20), time.monotonic())
    m.check(time.monotonic())
    m.on_engine_status(status(pid=21), time.monotonic())
    assert failed == [("scheduler.0", "restarted (pid 20 -> 21)")]


def test_replicas_join_and_fail_one_by_one():
    """Two replicas: each joins once (the client connects to its inbox), one dying fails
    only what it held, and the scheduler stays up while the other serves."""
    failed: list[tuple[str, str]] = []
    joined: list[tuple[int, str | None]] = []
    m = monitor(failed, joined)
    t = time.monotonic()
    m.on_engine_status(status(0, pid=20, device="cpu"), t)
    m.on_engine_status(status(1, pid=30, device="NVIDIA H200", gpus=["1"]), t)
    m.on_engine_status(status(1, pid=30, kind="heartbeat", device="NVIDIA H200", gpus=["1"]), t)
    assert joined == [(0, "ipc:///run/scheduler.0.sock"), (1, "ipc:///run/scheduler.1.sock")]
    assert m.alive_replicas(t) == [0, 1]
    m.check(t)
    m.on_disconnect(["scheduler.1"])
    m.check(time.monotonic() + DISCONNECT_SETTLE_S)
    assert failed == [("scheduler.1", "disconnected")]
    assert m.alive_replicas(time.monotonic()) == [0]
    assert "scheduler" not in m.missing()
    report = health_report(m, time.monotonic())["scheduler"]
    assert report["alive"] and report["replicas"]["1"]["alive"] is False
    assert report["replicas"]["0"]["pid"] == 20
    where = {k: (r["device"], r["gpus"]) for k, r in report["replicas"].items()}
    assert where == {"0": ("cpu", []), "1": ("NVIDIA H200", ["1"])}  # each one's GPU, named


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_replicas_of_another_model_secret_or_a_taken_id_are_refused():
    from common.auth import replica_proof

    caplog = _Records()
    logging.getLogger("zeroserve.frontend.cluster").addHandler(caplog)

    failed: list[tuple[str, str]] = []
    joined: list[tuple[int, str | None]] = []
    m = monitor(failed, joined, model_name="m", secret="s3cret")
    t = time.monotonic()
    assert m.on_engine_status(status(0, pid=20, proof=replica_proof("s3cret", 0, 20)), t)
    assert not m.on_engine_status(status(1, pid=30, model="other"), t)
    assert not m.on_engine_status(status(1, pid=31, proof=replica_proof("wrong", 1, 31)), t)
    assert not m.on_engine_status(status(1, pid=32, proof=replica_proof("s3cret", 0, 20)), t)
    dup = status(0, pid=40, inbox="tcp://10.0.0.9:7000", proof=replica_proof("s3cret", 0, 40))
    assert not m.on_engine_status(dup, t)
    assert not m.on_engine_status(dup, t)  # told once
    refusals = [r for r in caplog.records if "refused scheduler replica" in r.getMessage()]
    assert len(refusals) == 4, [r.getMessage() for r in refusals]
    assert "model 'other'" in refusals[0].getMessage()
    assert "secret" in refusals[1].getMessage() and "secret" in refusals[2].getMessage()
    assert "already served by pid 20" in refusals[3].getMessage()
    m.on_component(ComponentStatus("scheduler.0", 40, "stopping", 0.0), t)  # not the pid in
    assert joined == [(0, "ipc:///run/scheduler.0.sock")] and failed == []
    assert m.alive_replicas(t) == [0]
    logging.getLogger("zeroserve.frontend.cluster").removeHandler(caplog)
