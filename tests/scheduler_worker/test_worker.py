"""The scheduler worker's one record per request, driven message by message without its
loop: the detokenizer's settings go out once, a restarted frontend's requests are aborted
(and only those), and a request's record is gone once its finishing output is sent."""

from __future__ import annotations

import dataclasses
import time

import pytest

from common.auth import sign_rid
from common.messages import ComponentStatus, GenerateRequest, StepOutputs, pack_ids
from common.sampling_params import SamplingParams
from common.zmq_queue import PullQueue
from tests.garbage import collect, make_config, scheduler_under_test, sockets

pytestmark = pytest.mark.timeout(60)


def test_records_follow_requests_from_arrival_to_the_finishing_output(run_dir, tiny_llama_dir):
    config = make_config(run_dir, tiny_llama_dir)
    worker, frontend, detok = scheduler_under_test(config, tiny_llama_dir)
    params = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True, stop=["x"])
    with sockets(frontend, detok, worker.inbox, worker.to_detok, worker.to_frontend):
        worker.handle(ComponentStatus("frontend", 111, "heartbeat", time.time()))
        for rid, origin in (("old", 111), ("new", 222)):
            worker.handle(GenerateRequest(rid, pack_ids([1, 2, 3]), params, 11.0, origin))
        worker.publish(worker.engine.step_rows())  # as the worker's loop
        num_steps = 1
        assert worker.requests["new"].announced and worker.requests["old"].announced
        worker.handle(ComponentStatus("frontend", 222, "heartbeat", time.time()))
        assert worker.engine.requests.keys() == {"new"}  # the old frontend's: aborted
        while worker.engine.has_unfinished():
            worker.publish(worker.engine.step_rows())
            num_steps += 1
        assert worker.requests == {}
        steps = collect(detok, lambda ms: len(ms) == num_steps)
    assert all(isinstance(s, StepOutputs) for s in steps)
    assert [(r[0], r[1]) for s in steps for r in s.new_requests] == [("old", ["x"]), ("new", ["x"])]
    finished = {
        rid: (s.finish_reasons[i], s.timings[i] if s.timings else None)
        for s in steps
        for i, rid in enumerate(s.rids)
        if s.finish_reasons and s.finish_reasons[i]
    }
    assert finished.keys() == {"old", "new"}
    assert finished["old"][0] == "abort" and finished["new"][0] == "length"
    for _, t in finished.values():  # the tokenizer's stamp, from the record; the arrival
        assert t is not None and t["tokenized_time"] == 11.0  # stayed in the frontend
        assert "arrival_time" not in t


def test_a_signed_request_is_not_validated_again_but_the_offline_api_validates(
    run_dir, tiny_llama_dir, monkeypatch
):
    """With ipc.secret, a signed id proves the request came through the frontend's intake
    (validated there, its limits checked by a tokenizer worker): the engine admits it
    without checking again. The offline API (generate, add_request) checks every time."""
    config = make_config(run_dir, tiny_llama_dir)
    config = dataclasses.replace(config, ipc=dataclasses.replace(config.ipc, secret="s3cret"))
    worker, frontend, detok = scheduler_under_test(config, tiny_llama_dir)
    engine = worker.engine
    checks: list[int] = []
    real = engine.validate
    monkeypatch.setattr(engine, "validate", lambda ids, p: (checks.append(len(ids)), real(ids, p)))
    params = SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True)
    with sockets(frontend, detok, worker.inbox, worker.to_detok, worker.to_frontend):
        rid = sign_rid("s3cret", "cmpl-1-0")
        worker.handle(GenerateRequest(rid, pack_ids([1, 2, 3]), params, 0.0))
        assert rid in engine.requests and checks == []
        engine.abort(rid)
    out = engine.generate([[1, 2, 3, 4]], params)
    assert checks == [4] and len(out[0]) == 2


def test_with_two_frontends_each_gets_its_errors_and_only_a_restarted_ones_are_aborted(
    run_dir, tiny_llama_dir
):
    """api_servers 2: a rejected request's error goes to the frontend that accepted it
    (GenerateRequest.frontend), statuses to both, and a new pid of frontend 1 aborts
    frontend 1's requests only."""
    from common.messages import EngineStatus, RequestError
    from scheduler_worker.engine import LLMEngine
    from scheduler_worker.worker import SchedulerWorker

    config = dataclasses.replace(make_config(run_dir, tiny_llama_dir), api_servers=2)
    inboxes = [PullQueue(config.ipc.frontend_endpoint(i), bind=True) for i in range(2)]
    detok = PullQueue(config.ipc.endpoint("detok"), bind=True)
    worker = SchedulerWorker(config, LLMEngine(config.engine, tiny_llama_dir))
    params = SamplingParams(max_tokens=50, temperature=0.0, ignore_eos=True)
    with sockets(*inboxes, detok, worker.inbox, worker.to_detok, worker.to_frontend):
        worker.handle(ComponentStatus("frontend.0", 100, "heartbeat", time.time()))
        worker.handle(ComponentStatus("frontend.1", 111, "heartbeat", time.time()))
        for rid, origin, frontend in (("a", 100, 0), ("b", 111, 1)):
            worker.handle(GenerateRequest(rid, pack_ids([1, 2, 3]), params, 1.0, origin, frontend))
        worker.handle(GenerateRequest("empty", pack_ids([]), params, 1.0, 111, 1))
        worker.heartbeat()
        worker.publish(worker.engine.step_rows())
        worker.handle(ComponentStatus("frontend.1", 112, "heartbeat", time.time()))
        assert worker.engine.requests.keys() == {"a"}  # frontend 1 restarted: "b" aborted
        worker.handle(ComponentStatus("frontend.0", 100, "heartbeat", time.time()))
        assert worker.engine.requests.keys() == {"a"}
        got = [collect(q, lambda ms: any(isinstance(m, EngineStatus) for m in ms)) for q in inboxes]
        steps = collect(detok, lambda ms: len(ms) >= 1)
    errors = [[m.rid for m in ms if isinstance(m, RequestError)] for ms in got]
    assert errors == [[], ["empty"]]
    assert [r[4] for r in steps[0].new_requests] == [0, 1]  # the detok routes by these
