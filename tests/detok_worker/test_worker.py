"""The detok worker's step processing: a request finished by one of its stop_token_ids
does not show that token's text (as vLLM), unless include_stop_str_in_output."""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from common.config import Config, IPCConfig
from common.messages import StepOutputs, pack_ids
from common.zmq_queue import PullQueue, PushQueue
from tests.common.wire_samples import step_outputs


@pytest.fixture
def worker(default_model_dir):
    from detok_worker.worker import DetokWorker

    run_dir = Path(tempfile.mkdtemp(dir="/tmp", prefix="zsd-"))
    config = Config(ipc=IPCConfig(run_dir=str(run_dir)))
    peers = [PullQueue(config.ipc.endpoint(name), bind=True) for name in ("frontend", "scheduler")]
    w = DetokWorker(config, Tokenizer.from_file(str(default_model_dir / "tokenizer.json")))
    yield w
    w.shell.close()
    for q in peers:
        q.close()
    shutil.rmtree(run_dir, ignore_errors=True)


def test_stop_token_text_is_dropped_unless_asked_for(worker):
    ids = worker.tokenizer.encode("Hello world, again").ids
    stop = ids[-1]
    rids = ["plain", "keep", "length"]
    step = step_outputs(
        0,
        rids,
        [pack_ids(ids)] * 3,
        ["stop", "stop", "length"],
        [3] * 3,
        [len(ids)] * 3,
        None,
        [
            ("plain", [], True, False, 0, 0),
            ("keep", [], True, True, 0, 0),
            ("length", [], True, False, 0, 0),
        ],
        None,
        time.time(),
        [stop, stop, None],
    )
    out = worker.process(step)
    texts = dict(zip(out.rids, out.texts))
    reasons = dict(zip(out.rids, out.stop_reasons))
    whole = worker.tokenizer.decode(ids)
    assert texts["plain"] == worker.tokenizer.decode(ids[:-1]) != whole
    assert texts["keep"] == whole and texts["length"] == whole
    assert reasons == {"plain": stop, "keep": stop, "length": None}
    assert out.num_output_tokens == [len(ids)] * 3  # the token still counts


def test_a_schedulers_stopping_is_forwarded_behind_its_outputs(run_dir, default_model_dir):
    """The scheduler's last word goes through the detok, so the frontend hears it only
    after the outputs the scheduler sent before it (it then fails what is still open)."""
    from common.messages import ComponentStatus, TextOutputs
    from detok_worker.worker import DetokWorker
    from tests.garbage import collect, make_config, running, sockets

    config = make_config(run_dir)
    frontend = PullQueue(config.ipc.endpoint("frontend"), bind=True)
    scheduler = PullQueue(config.ipc.endpoint("scheduler"), bind=True)
    worker = DetokWorker(config, Tokenizer.from_file(str(default_model_dir / "tokenizer.json")))
    push = PushQueue(config.ipc.endpoint("detok"), bind=False)
    steps = [
        step_outputs(
            i,
            [f"r{i}"],
            [pack_ids([28])],
            ["length"],
            [1],
            [1],
            None,
            [(f"r{i}", [], True, False, 0, 0)],
            None,
            time.time(),
        )
        for i in range(20)
    ]
    with sockets(frontend, scheduler, push), running(worker) as thread:
        for step in steps:
            push.put(step)
        push.put(ComponentStatus("scheduler", 4242, "stopping", time.time()))
        got = collect(
            frontend,
            lambda ms: any(
                isinstance(m, ComponentStatus) and m.component == "scheduler" for m in ms
            ),
            thread,
        )
        worker.stop()
        worker.stop()
    order = [
        m.rids[0] if isinstance(m, TextOutputs) else m.kind
        for m in got
        if isinstance(m, TextOutputs) or m.component == "scheduler"
    ]
    assert order == [f"r{i}" for i in range(20)] + ["stopping"]


def test_stream_interval_sends_the_first_token_then_every_n(worker):
    """stream_interval 3: the first token at once, then every 3 tokens, and the finish; the
    same text, token ids and logprobs as with every token sent."""
    from common.messages import unpack_ids

    worker.stream_interval = 3
    ids = worker.tokenizer.encode("one two three four five six seven eight").ids
    assert len(ids) == 8
    sent = []
    for i, tid in enumerate(ids):
        last = i == len(ids) - 1
        k = 2 if i <= 1 else 1  # "s" runs for two steps only
        step = step_outputs(
            i,
            ["r", "s"][:k],
            [pack_ids([tid])] * k,
            ["length" if last else None, "stop" if i == 1 else None][:k],
            [4] * k,
            [i + 1] * k,
            [[[-0.1 * i, []]], None][:k],
            [("r", [], True, False, 0, 0), ("s", [], True, False, 0, 0)] if i == 0 else [],
            None,
            time.time(),
        )
        out = worker.process(step)
        lps = out.logprobs or [None] * len(out.rids)
        sent += [(i, *row) for row in zip(out.rids, out.texts, out.token_ids, lps)]
    r = [(i, text, unpack_ids(tok), lp) for i, rid, text, tok, lp in sent if rid == "r"]
    assert [i for i, *_ in r] == [0, 3, 6, 7]  # first, +3, +3, the finish
    assert [len(toks) for _, _, toks, _ in r] == [1, 3, 3, 1]
    assert "".join(text for _, text, _, _ in r) == worker.tokenizer.decode(ids)
    assert [t for _, _, toks, _ in r for t in toks] == ids
    assert [e[0] for *_, lp in r for e in lp] == pytest.approx([-0.1 * i for i in range(8)])
    # a request that finishes before its interval is up sends at the finish
    assert [i for i, rid, *_ in sent if rid == "s"] == [0, 1]
    assert not worker.held and not worker.sent_at


def test_a_drain_waits_for_a_replica_that_still_steps_slowly(
    run_dir, default_model_dir, monkeypatch
):
    """After SIGTERM the detok stays while a replica that stepped has not said "stopping",
    even through a gap between steps longer than the quiet period (a stalled step on a
    loaded machine); its "stopping" (or its silence for REPLICA_SILENT_S) ends the wait."""
    import detok_worker.worker as dw
    from common.messages import ComponentStatus
    from tests.garbage import make_config, running, sockets

    config = make_config(run_dir)
    frontend = PullQueue(config.ipc.endpoint("frontend"), bind=True)
    worker = dw.DetokWorker(config, Tokenizer.from_file(str(default_model_dir / "tokenizer.json")))
    worker.shell.drain.quiet_s = 0.2
    push = PushQueue(config.ipc.endpoint("detok"), bind=False)

    def step(i: int, replica: int) -> StepOutputs:
        new = [(f"r{replica}", [], True, False, 0, 0)] if i == 0 else []
        return step_outputs(
            i, [f"r{replica}"], [pack_ids([28])], [None], [1], [i + 1], None, new, None,
            time.time(), replica=replica,
        )  # fmt: skip

    with sockets(frontend, push), running(worker) as thread:
        push.put(step(0, 3))
        deadline = time.monotonic() + 10
        while not worker.stepping:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        worker.stop()
        time.sleep(0.8)  # four quiet periods without a step: replica 3 still owes outputs
        assert thread.is_alive()
        push.put(step(1, 3))
        push.put(ComponentStatus("scheduler.3", 4242, "stopping", time.time()))
        thread.join(timeout=5)
        assert not thread.is_alive()  # its last word came: quiet, then done
        # a replica that falls silent without a word holds the drain REPLICA_SILENT_S only
        monkeypatch.setattr(dw, "REPLICA_SILENT_S", 0.5)
        worker.stepping = {7: time.monotonic()}
        assert worker.busy()
        time.sleep(0.6)
        assert not worker.busy()


def test_with_two_frontends_each_gets_its_own_requests_text_and_every_status(
    run_dir, default_model_dir
):
    """api_servers 2: one TextOutputs per frontend with a request in the step, holding
    only that frontend's (NewRequest's last item); a scheduler's status to both; a
    frontend that takes nothing (no process at its inbox, queue full) costs the other
    nothing."""
    import dataclasses

    from common.messages import ComponentStatus, TextOutputs
    from common.zmq_queue import QueueFull
    from detok_worker.worker import DetokWorker
    from tests.garbage import collect, make_config, sockets

    config = dataclasses.replace(make_config(run_dir), api_servers=2)
    inboxes = [PullQueue(config.ipc.frontend_endpoint(i), bind=True) for i in range(2)]
    worker = DetokWorker(config, Tokenizer.from_file(str(default_model_dir / "tokenizer.json")))
    ids = worker.tokenizer.encode("Hello world").ids

    def step(i: int, finish: str | None) -> StepOutputs:
        rids = ["a0", "b1", "c1"]
        new = [
            ("a0", [], True, False, 0, 0),
            ("b1", [], True, False, 1, 0),
            ("c1", [], True, False, 1, 0),
        ]
        return step_outputs(
            i,
            rids,
            [pack_ids(ids)] * 3,
            [finish] * 3,
            [2] * 3,
            [len(ids) * (i + 1)] * 3,
            None,
            new if i == 0 else [],
            None,
            time.time(),
        )

    worker.handle(step(0, None))
    worker.handle(step(1, "length"))
    worker.handle(ComponentStatus("scheduler.0", 4242, "heartbeat", time.time()))
    got = [collect(q, lambda ms: any(isinstance(m, ComponentStatus) for m in ms)) for q in inboxes]
    assert worker.frontend_of == {}  # finished: forgotten
    for frontend, rids in ((0, ["a0"]), (1, ["b1", "c1"])):
        outs = [m for m in got[frontend] if isinstance(m, TextOutputs)]
        assert [m.rids for m in outs] == [rids, rids], frontend
        assert "".join(outs[0].texts[:1] + outs[1].texts[:1]) == worker.tokenizer.decode(ids * 2)
    # frontend 1 gone for good: its queue fills; frontend 0 still gets every step
    inboxes[1].close()
    full = worker.to_frontend.queues[1]
    with pytest.raises(QueueFull):
        for _ in range(100_000):
            full.put(ComponentStatus("x", 1, "heartbeat", 0.0))
    with sockets(inboxes[0], worker.shell):
        t0 = time.monotonic()
        worker.handle(step(0, "length"))
        assert time.monotonic() - t0 < 1.0  # never waited on frontend 1
        assert [m.rids for m in collect(inboxes[0], lambda ms: len(ms) >= 1)] == [["a0"]]
    assert worker.dropping == {1}
