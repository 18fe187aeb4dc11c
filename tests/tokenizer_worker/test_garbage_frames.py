"""No frame a peer can send kills the tokenizer worker (see tests/garbage.py)."""

from __future__ import annotations

import os

import pytest

from common.messages import (
    GenerateRequest,
    TokenizeRequest,
    encode,
    pack_ids,
    unpack_ids,
)
from common.sampling_params import SamplingParams
from common.zmq_queue import PullQueue
from tests.garbage import (
    RawPush,
    collect,
    errors_for,
    make_config,
    malformed,
    misrouted,
    running,
    sockets,
)

pytestmark = pytest.mark.timeout(60)


def test_tokenizer_worker_survives_garbage(run_dir, default_model_dir):
    from tokenizer_worker.worker import Tokenization, TokenizerWorker

    config = make_config(run_dir)
    ipc = config.ipc
    frontend = PullQueue(ipc.endpoint("frontend"), bind=True)
    scheduler = PullQueue(ipc.endpoint("scheduler"), bind=True)
    push = RawPush(ipc.endpoint("tokenizer"), bind=True, peer=str(os.getpid()).encode())
    worker = TokenizerWorker(config, Tokenization(default_model_dir, max_model_len=64))

    def tr(rid, kind="completion", prompt="Hi", ids=None, messages=None, params=None):
        return TokenizeRequest(rid, kind, prompt, ids, messages, SamplingParams(**(params or {})))

    bad = [
        tr("bad-kind", kind="bogus"),
        tr("bad-temperature", params={"temperature": -1}),
        tr("bad-top-p", params={"top_p": 0}),
        tr("bad-min-tokens", params={"max_tokens": 2, "min_tokens": 3}),
        tr("bad-too-long", params={"max_tokens": 10**9}),
        tr("bad-empty", prompt=""),
        tr("bad-ids-vocab", prompt=None, ids=pack_ids([1, 10**6])),
        tr("bad-ids-bytes", prompt=None, ids=b"\x01\x02\x03"),
        tr("bad-ids-negative", prompt=None, ids=b"\xff\xff\xff\xff"),
        tr("bad-chat-none", kind="chat", prompt=None),
        tr("bad-chat-items", kind="chat", prompt=None, messages=[1, "two", None]),
        tr("bad-chat-missing", kind="chat", prompt=None, messages=[{"role": "user"}]),
        tr("bad-chat-nested", kind="chat", prompt=None, messages=[{"role": [], "content": {}}]),
    ]
    good = [
        tr("good", params={"max_tokens": 3, "temperature": 0.0}),
        tr("good-chat", kind="chat", prompt=None, messages=[{"role": "user", "content": "Hi"}]),
    ]
    frames = malformed(good[0])
    with sockets(frontend, scheduler, push), running(worker) as thread:
        push.send_all(frames)
        push.send_all(misrouted(TokenizeRequest))
        push.send_all(encode(m) for m in bad)
        push.send_all(encode(m) for m in good)
        got = collect(scheduler, lambda ms: {m.rid for m in ms} >= {"good", "good-chat"}, thread)
        assert thread.is_alive()
        assert all(isinstance(m, GenerateRequest) for m in got)
        assert [m.rid for m in got] == ["good", "good-chat"], "a bad request got through"
        assert unpack_ids(got[0].prompt_token_ids) == worker.tokenization.tokenizer.encode("Hi").ids
        assert got[0].params.max_tokens == 3
        want = {m.rid for m in bad}
        errs = errors_for(collect(frontend, lambda ms: set(errors_for(ms)) >= want, thread))
        assert set(errs) == want
        assert all(e.status == 400 for e in errs.values()), errs
        assert worker.inbox.num_dropped == len(frames)
    assert worker.num_done == 2
