"""One owner per model fact: the replicas announce theirs, the frontend refuses a component
that disagrees (one log line), and uses the replicas' numbers (frontend.cluster)."""

from __future__ import annotations

import logging
import time

from common.messages import ComponentStatus, EngineStatus, decode, encode
from common.model_facts import ModelFacts
from frontend.cluster.health import health_report
from frontend.cluster.routing import prefix_key
from frontend.cluster.table import Cluster
from tests.frontend.conftest import serve
from tests.frontend.fake_backend import BLOCK_SIZE


def replica(k: int = 0, pid: int = 20, vocab: int = 32, context: int = 64, block: int = 16):
    return EngineStatus(
        "ready",
        0,
        0,
        0.0,
        8,
        8,
        0,
        0,
        "m",
        context,
        vocab,
        0.0,
        replica=k,
        pid=pid,
        inbox=f"ipc:///run/scheduler.{k}.sock",
        block_size=block,
    )


def tokenizer(pid: int, facts: ModelFacts | None, kind: str = "heartbeat") -> ComponentStatus:
    return ComponentStatus("tokenizer", pid, kind, 0.0, None if facts is None else facts.to_wire())


def refusals(caplog, what: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if f"refused {what}" in r.getMessage()]


def test_facts_travel_on_the_wire():
    facts = ModelFacts("m", 32, 64, 0)
    msg = decode(encode(tokenizer(7, facts)))
    assert isinstance(msg, ComponentStatus) and ModelFacts.from_wire(msg.facts) == facts
    assert decode(encode(replica(block=32))).block_size == 32


def test_a_tokenizer_worker_that_disagrees_with_the_replicas_gets_no_request(caplog):
    """Workers usually come up before the replicas: each is vetted when the first replica
    joins, and again on each of its statuses; a refused one is down for /health and is
    never picked, and what it held fails; the one log line is written once."""
    c = Cluster(0.5)
    now = time.monotonic()
    good, bad = ModelFacts("m", 32, 64, 0), ModelFacts("m", 32, 128, 0)
    c.on_status(tokenizer(1, good, "ready"), now)
    c.on_status(tokenizer(2, bad, "ready"), now)
    assert c.choose_tokenizer(now) in (1, 2)  # no replica yet: nothing to compare with
    c.sent("r-held", 2)
    c.sent("r-other", 1)
    with caplog.at_level(logging.ERROR, "frontend.cluster"):
        assert c.on_status(replica(), now) is not None
        for t in (0.1, 0.2, 0.3):  # its heartbeats: still refused, not logged again
            c.on_status(tokenizer(2, bad), now + t)
            c.on_status(tokenizer(1, good), now + t)
    lines = refusals(caplog, "tokenizer worker")
    assert len(lines) == 1, lines
    assert "pid 2" in lines[0] and "max_model_len 128 (not 64)" in lines[0]
    assert all(c.choose_tokenizer(now + 0.3) == 1 for _ in range(5))
    assert health_report(c, now + 0.3)["tokenizer"] == {
        "alive": True,
        "last_seen_s": 0.0,
        "workers": 1,
        "refused": 1,
    }
    events = c.check(now + 0.3)  # what the refused worker held fails, and only that
    assert [(e.component, e.rids) for e in events] == [("tokenizer", ["r-held"])]
    assert c.held == {"r-other": 1}

    # a worker that disagrees on the vocabulary, alone: the pool is missing
    c2 = Cluster(0.5)
    c2.on_status(replica(vocab=32), now)
    c2.on_status(tokenizer(3, ModelFacts("m", 50, 64, 0), "ready"), now)
    assert "tokenizer" in c2.missing(now) and c2.choose_tokenizer(now) is None
    # restarted with the right model: served again
    c2.on_status(tokenizer(3, ModelFacts("m", 32, 64, 0)), now + 0.1)
    assert c2.choose_tokenizer(now + 0.1) == 3 and "tokenizer" not in c2.missing(now + 0.1)


def test_a_replica_with_another_block_size_is_refused_once(caplog):
    c = Cluster(0.5, model_name="m")
    now = time.monotonic()
    assert c.on_status(replica(0, pid=20, block=16), now) is not None
    with caplog.at_level(logging.ERROR, "frontend.cluster"):
        for t in (0.0, 0.1, 0.2):  # its ready and heartbeats
            assert c.on_status(replica(1, pid=21, block=32), now + t) is None
    lines = refusals(caplog, "scheduler replica")
    assert len(lines) == 1, lines
    assert "replica 1" in lines[0] and "block_size 32 (not 16)" in lines[0]
    assert c.alive_replicas(now + 0.2) == [0]
    assert all(c.choose(None, None, {}) == 0 for _ in range(4))
    assert c.on_status(replica(2, pid=22, block=16), now) is not None  # agrees: joins
    assert c.alive_replicas(now) == [0, 2]


def test_routing_uses_the_block_size_the_replicas_announced():
    """The routing key covers the replicas' first KV block, not the frontend's config."""
    c = Cluster(0.5)
    assert c.facts() is None
    now = time.monotonic()
    c.on_status(replica(0, block=4), now)
    c.on_status(replica(1, pid=21, block=4), now)
    assert c.facts() == ModelFacts("m", 32, 64, 4)
    text = "x" * 16 + "tail"  # one 4-token block of text, not a 16-token one
    key = prefix_key(text, None, c.facts().block_size)
    assert key is not None and prefix_key(text, None, 16) is None
    home = c.choose(None, key, {})
    assert all(c.choose(None, key, {home: 1}) == home for _ in range(4))  # affinity holds


def test_the_server_keys_its_routing_on_the_replicas_block_size():
    """The fake replica announces 4-token blocks, the frontend's config says 16: a prompt
    of one 4-token block of text (16 characters) gets a prefix key, so affinity is on."""
    with serve() as s, s.client() as c:
        assert s.config.engine.cache.block_size == 16 != BLOCK_SIZE
        router = s.app.state.client.cluster.router  # type: ignore[attr-defined]
        assert c.post("/v1/completions", json={"prompt": "y" * 15}).status_code == 200
        assert len(router.last) == 0  # shorter than one announced block: no key
        assert c.post("/v1/completions", json={"prompt": "x" * 16}).status_code == 200
        assert list(router.last) == [prefix_key("x" * 16, None, BLOCK_SIZE)]
