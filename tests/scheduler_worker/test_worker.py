"""The scheduler worker's one record per request, driven message by message without its
loop: the detokenizer's settings go out once, a restarted frontend's requests are aborted
(and only those), and a request's record is gone once its finishing output is sent."""

from __future__ import annotations

import time

import pytest

from common.messages import ComponentStatus, GenerateRequest, StepOutputs, pack_ids
from common.sampling_params import SamplingParams
from common.zmq_queue import PullQueue
from tests.garbage import collect, make_config, sockets

pytestmark = pytest.mark.timeout(60)


def test_records_follow_requests_from_arrival_to_the_finishing_output(run_dir, tiny_llama_dir):
    from scheduler_worker.engine import LLMEngine
    from scheduler_worker.worker import SchedulerWorker

    config = make_config(run_dir, tiny_llama_dir)
    frontend = PullQueue(config.ipc.endpoint("frontend"), bind=True)
    detok = PullQueue(config.ipc.endpoint("detok"), bind=True)
    worker = SchedulerWorker(config, LLMEngine(config.engine, tiny_llama_dir))
    params = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True, stop=["x"]).to_dict()
    with sockets(frontend, detok, worker.inbox, worker.to_detok, worker.to_frontend):
        worker.handle(ComponentStatus("frontend", 111, "heartbeat", time.time()))
        for rid, origin in (("old", 111), ("new", 222)):
            worker.handle(GenerateRequest(rid, pack_ids([1, 2, 3]), params, 10.0, 11.0, origin))
        worker.publish(worker.engine.step())
        num_steps = 1
        assert worker.requests["new"].announced and worker.requests["old"].announced
        worker.handle(ComponentStatus("frontend", 222, "heartbeat", time.time()))
        assert worker.engine.requests.keys() == {"new"}  # the old frontend's: aborted
        while worker.engine.has_unfinished():
            worker.publish(worker.engine.step())
            num_steps += 1
        assert worker.requests == {}
        steps = collect(detok, lambda ms: len(ms) == num_steps)
    assert all(isinstance(s, StepOutputs) for s in steps)
    assert [(r[0], r[1]) for s in steps for r in s.new_requests] == [("old", ["x"]), ("new", ["x"])]
    finished = {
        rid: (s.finish_reasons[i], s.timings[i] if s.timings else None)
        for s in steps
        for i, rid in enumerate(s.rids)
        if s.finish_reasons[i]
    }
    assert finished.keys() == {"old", "new"}
    assert finished["old"][0] == "abort" and finished["new"][0] == "length"
    for _, t in finished.values():  # the earlier stages' stamps, from the record
        assert t is not None and (t["arrival_time"], t["tokenized_time"]) == (10.0, 11.0)
