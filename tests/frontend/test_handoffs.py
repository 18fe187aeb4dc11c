"""TokenizerHandoffs: which requests a dead or hung tokenizer worker takes with it."""

from __future__ import annotations

from common.messages import TokenizeAck
from frontend.handoffs import ACK_GRACE_S, TokenizerHandoffs


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
