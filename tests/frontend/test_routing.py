"""frontend.cluster.routing: least loaded, prefix affinity within the imbalance threshold."""

from __future__ import annotations

from frontend.cluster.routing import AFFINITY_SLACK, ReplicaLoad, Router, prefix_key


def load(replica: int, waiting: int = 0, running: int = 0, kv: float = 0.0, open_: int = -1):
    return ReplicaLoad(replica, waiting, running, kv, waiting + running if open_ < 0 else open_)


def test_least_loaded_counts_waiting_four_times_then_kv_usage_then_id():
    r = Router()
    assert r.pick([load(0, running=5), load(1, waiting=1, running=2)]) == 0  # 5 < 6
    assert r.pick([load(0, running=7), load(1, waiting=1, running=2)]) == 1  # 7 > 6
    assert r.pick([load(0, running=2, kv=0.5), load(1, running=2, kv=0.2)]) == 1
    assert r.pick([load(0, running=2), load(1, running=2)]) == 0


def test_requests_routed_since_the_heartbeat_count_as_waiting():
    r = Router()
    # replica 0 looked idle at its heartbeat, but 3 requests went there since
    assert load(0, open_=3).score == 12
    assert r.pick([load(0, open_=3), load(1, running=10)]) == 1
    assert r.pick([load(0, open_=2), load(1, running=10)]) == 0


def test_a_prefix_goes_home_within_the_threshold():
    r = Router()
    key = b"system prompt A"
    assert r.pick([load(0), load(1)], key) == 0
    # replica 0 is now busier, but within the slack: the prefix stays
    assert r.pick([load(0, running=AFFINITY_SLACK), load(1)], key) == 0
    # past the threshold: the least loaded takes this one, the prefix keeps its home
    assert r.pick([load(0, running=AFFINITY_SLACK + 1), load(1)], key) == 1
    assert r.pick([load(0, running=3), load(1)], key) == 0
    # another prefix is routed by load alone
    assert r.pick([load(0, running=3), load(1)], b"other") == 1


def test_a_dead_replica_is_skipped_and_its_prefixes_move():
    r = Router()
    key = b"k"
    assert r.pick([load(0, running=1), load(1)], key) == 1
    assert r.pick([load(0, running=1)], key) == 0  # replica 1 is not among the live ones
    assert r.pick([load(0, running=1), load(1)], key) == 0  # and the prefix lives on 0 now


def test_prefix_key_covers_one_full_kv_block():
    assert prefix_key("x" * 63, None, 16) is None  # shorter than 16 tokens' worth of text
    a = prefix_key("x" * 64 + "tail one", None, 16)
    assert a is not None and a == prefix_key("x" * 64 + "another tail", None, 16)
    assert prefix_key(None, list(range(15)), 16) is None
    assert prefix_key(None, list(range(16)), 16) == prefix_key(None, [*range(16), 99], 16)
    assert prefix_key(None, list(range(16)), 16) != prefix_key(None, list(range(1, 17)), 16)


def test_round_robin_ignores_load_and_prefixes():
    r = Router("round_robin")
    picks = [r.pick([load(0, running=50), load(1)], b"k") for _ in range(4)]
    assert sorted(picks) == [0, 0, 1, 1] and picks[0] != picks[1]
