"""No frame a peer can send kills the detokenizer (see tests/garbage.py)."""

from __future__ import annotations

import time

import pytest
from tokenizers import Tokenizer

from common.messages import (
    StepOutputs,
    TextOutputs,
    encode,
    pack_ids,
)
from common.zmq_queue import PullQueue
from tests.garbage import (
    RawPush,
    collect,
    make_config,
    malformed,
    misrouted,
    running,
    sockets,
)

pytestmark = pytest.mark.timeout(60)


def test_detok_worker_survives_garbage(run_dir, default_model_dir):
    from detok_worker.worker import DetokWorker

    tokenizer = Tokenizer.from_file(str(default_model_dir / "tokenizer.json"))
    config = make_config(run_dir)
    ipc = config.ipc
    frontend = PullQueue(ipc.endpoint("frontend"), bind=True)
    scheduler = PullQueue(ipc.endpoint("scheduler"), bind=True)
    worker = DetokWorker(config, tokenizer)
    push = RawPush(ipc.endpoint("detok"), bind=False)
    now = time.time()
    ids = tokenizer.encode("Hello world").ids

    def so(rids, new_ids, finish=None, prompt=None, out=None, logprobs=None, new=()):
        n = len(rids)
        return StepOutputs(
            0,
            rids,
            new_ids,
            finish if finish is not None else [None] * n,
            prompt if prompt is not None else [1] * n,
            out if out is not None else [1] * n,
            logprobs,
            list(new),
            None,
            now,
        )

    bad = [
        so(["u1", "u2"], [pack_ids([5])]),  # parallel lists of unequal lengths
        so(["u3"], [pack_ids([5])], finish=[]),
        so(["u4"], [pack_ids([5])], prompt=[], out=[]),
        so(["u5", "u6"], [pack_ids([5]), pack_ids([6])], logprobs=[None]),
        so([], [pack_ids([5])]),  # ids for no request
        so(["ids-bytes"], [b"\x01\x02\x03"], finish=["length"]),
        so(["ids-negative"], [b"\xff\xff\xff\xff"], finish=["length"]),
        so(["ids-vocab"], [pack_ids([10**6, 2**31 - 1])], finish=["length"]),
        so(["odd-finish"], [pack_ids([5])], finish=["whatever"]),
        so(["empty-stop"], [pack_ids([5])], new=[("empty-stop", ["", ""], False, True)]),
        so(["dup", "dup"], [pack_ids([5]), pack_ids([6])], finish=["length", None]),
        so(["late"], [pack_ids([5])], new=[("nobody", ["x"], True, False)] * 3),
    ]
    good = so(
        ["good"],
        [pack_ids(ids)],
        finish=["length"],
        prompt=[3],
        out=[len(ids)],
        new=[("good", [], True, False)],
    )
    frames = malformed(good)
    with sockets(frontend, scheduler, push), running(worker) as thread:
        push.send_all(frames)
        push.send_all(misrouted(StepOutputs))
        push.send_all(encode(m) for m in bad)
        push.send(encode(good))

        def has_good(ms):
            return any(isinstance(m, TextOutputs) and "good" in m.rids for m in ms)

        got = collect(frontend, has_good, thread)
        assert thread.is_alive()
        out = next(m for m in got if isinstance(m, TextOutputs) and "good" in m.rids)
        assert out.rids == ["good"] and out.texts == ["Hello world"]
        assert out.finish_reasons == ["length"] and out.token_ids == [pack_ids(ids)]
        assert out.num_prompt_tokens == [3] and out.num_output_tokens == [len(ids)]
        for m in got:  # whatever went out for the bad steps still fits the wire schema
            if isinstance(m, TextOutputs):
                encode(m)
                n = len(m.rids)
                assert len(m.texts) == len(m.finish_reasons) == len(m.token_ids) == n
        assert worker.inbox.num_dropped == len(frames)
        assert "good" not in worker.requests  # finished: forgotten
