"""Garbage on every socket (helpers and the garbage itself: tests/garbage.py): no frame a
peer can send kills a component's inbox. Each worker runs its real loop in a thread behind
real ipc sockets; malformed frames, misrouted messages and well-formed messages with bad
content go in, then valid ones, which must still be answered.

    the garbage itself        every malformed frame fails to decode
    the frontend's inbox      engine_client's receive loop
    a tokenizer worker        TokenizeRequest in, GenerateRequest / RequestError out
    the scheduler worker      GenerateRequest / AbortRequest in, StepOutputs out
    the detok worker          StepOutputs in, TextOutputs out
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import replace

import pytest
from tokenizers import Tokenizer

from common.messages import (
    AbortRequest,
    ComponentStatus,
    EngineStatus,
    GenerateRequest,
    RequestError,
    StepOutputs,
    TextOutputs,
    TokenizeRequest,
    encode,
    pack_ids,
    unpack_ids,
)
from common.sampling_params import SamplingParams
from common.zmq_queue import PullQueue
from tests.common.wire_samples import step_outputs
from tests.garbage import (
    WAIT_S,
    RawPush,
    collect,
    errors_for,
    make_config,
    malformed,
    misrouted,
    running,
    samples,
    sockets,
)

pytestmark = pytest.mark.timeout(60)


def test_malformed_frames_really_are_malformed():
    """The fixture itself: every frame of `malformed` fails to decode."""
    from common.messages import WireError, decode

    for sample in samples().values():
        for frame in malformed(sample):
            if isinstance(frame, list):
                continue  # multipart: rejected by the queue, not the codec
            with pytest.raises(WireError):
                decode(frame)


def test_frontend_inbox_survives_garbage(run_dir):
    from frontend.cluster.engine_client import EngineClient
    from frontend.metrics import Metrics
    from frontend.request_handle import Delta, RequestHandle

    config = make_config(run_dir)
    client = EngineClient(config, Metrics())

    async def scenario() -> None:
        client.start()
        push = RawPush(config.ipc.endpoint("frontend"), bind=False)
        try:
            handle = RequestHandle(["r1", "r2"], time.monotonic(), 60.0)
            client.routes.update({"r1": (handle, 0), "r2": (handle, 1)})
            now = time.time()
            frames = malformed(ComponentStatus("detok", 1, "ready", now))
            push.send_all(frames)
            push.send_all(misrouted(TextOutputs, RequestError, EngineStatus, ComponentStatus))
            push.send_all(
                encode(m)
                for m in [
                    TextOutputs(
                        ["r1", "r2"], ["a"], [None], [1], [1], [b""], None, None, [None], now
                    ),
                    TextOutputs(
                        ["r1"], ["a"], [None], [1], [1], [b""], [None, None], None, [None], now
                    ),
                    TextOutputs(
                        ["nobody"], ["a"], ["stop"], [1], [1], [b""], None, None, [None], now
                    ),
                    RequestError("nobody", 400, "x", "invalid_request_error", None),
                    RequestError("r2", 999, "odd status", "server_error", None),
                    EngineStatus("weird", -1, -1, 7.5, -1, 0, -5, -9, "", 0, 0, -1.0),
                    ComponentStatus("martian", -1, "ready", now),
                    ComponentStatus("detok", 4343, "??", now),  # same pid: a new one = restart
                ]
            )
            pack5 = pack_ids([5])
            good = [
                EngineStatus("ready", 0, 0, 0.0, 64, 64, 0, 0, config.model_name, 64, 512, now),
                ComponentStatus("tokenizer", 4242, "ready", now),
                ComponentStatus("detok", 4343, "ready", now),
                TextOutputs(["r1"], ["hi"], ["length"], [2], [1], [pack5], None, None, [None], now),
            ]
            push.send_all(encode(m) for m in good)
            await client.cluster.wait_ready(WAIT_S, stopped=lambda: False)
            first = await asyncio.wait_for(handle.queue.get(), WAIT_S)
            second = await asyncio.wait_for(handle.queue.get(), WAIT_S)
            assert client._thread is not None and client._thread.is_alive()
            # r2 failed with the out-of-range status mapped to 500; r1 got its text
            assert getattr(first, "status", None) == 500
            assert isinstance(second, Delta) and second.text == "hi" and second.index == 0
            assert second.finish_reason == "length" and not client.routes
            assert client._inbox is not None and client._inbox.num_dropped == len(frames)
        finally:
            push.close()
            client.close()

    asyncio.run(scenario())


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


def test_scheduler_worker_survives_garbage(run_dir, tiny_llama_dir):
    from scheduler_worker.engine import LLMEngine
    from scheduler_worker.worker import SchedulerWorker

    config = make_config(run_dir, tiny_llama_dir)
    ipc = config.ipc
    engine = LLMEngine(config.engine, tiny_llama_dir)
    frontend = PullQueue(ipc.endpoint("frontend"), bind=True)
    detok = PullQueue(ipc.endpoint("detok"), bind=True)
    worker = SchedulerWorker(config, engine)
    push = RawPush(ipc.endpoint("scheduler"), bind=False)
    now = time.time()
    greedy = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)

    def gr(rid, ids=None, params=None):
        ids = pack_ids([1, 2, 3, 4, 5]) if ids is None else ids
        return GenerateRequest(rid, ids, greedy if params is None else params, now)

    bad = [
        gr("bad-ids-bytes", ids=b"\x01\x02\x03"),
        gr("bad-ids-empty", ids=b""),
        gr("bad-ids-negative", ids=b"\xff\xff\xff\xff"),
        gr("bad-ids-vocab", ids=pack_ids([1, engine.vocab_size])),
        # well-typed (mistyped ones are malformed frames: tests.garbage.bad_params)
        gr("bad-temperature", params=SamplingParams(temperature=-1)),
        gr("bad-context", params=SamplingParams(max_tokens=10**6)),
        gr("bad-stop", params=SamplingParams(stop=[""])),
        gr("bad-logprobs", params=SamplingParams(logprobs=99)),
        gr("bad-min-tokens", params=SamplingParams(max_tokens=2, min_tokens=3)),
        gr("bad-bias", params=SamplingParams(logit_bias={engine.vocab_size: 1.0})),
    ]
    frames = malformed(gr("sample"))
    with sockets(frontend, detok, push), running(worker) as thread:
        push.send_all(frames)
        push.send_all(misrouted(GenerateRequest, AbortRequest))
        push.send_all(encode(m) for m in bad)
        # forged aborts: unknown rids, a rid that failed above, and one whose request
        # arrives after its abort (it must never run)
        for rid in ("ghost", "bad-temperature", "late", "", "x" * 10_000):
            push.send(encode(AbortRequest(rid, "forged")))
        push.send(encode(gr("late")))
        push.send(encode(gr("good")))

        def good_done(ms):
            return any(
                isinstance(m, StepOutputs)
                and "good" in m.rids
                and m.finish_reasons is not None
                and m.finish_reasons[m.rids.index("good")] is not None
                for m in ms
            )

        steps = collect(detok, good_done, thread)
        assert thread.is_alive()
        assert all(isinstance(m, StepOutputs) for m in steps)
        tokens, reasons = [], []
        for m in steps:
            assert set(m.rids) == {"good"}, m.rids  # nothing bad, aborted or forged ran
            tokens += unpack_ids(m.new_token_ids)
            reasons.append(m.finish_reasons and m.finish_reasons[0])
        assert len(tokens) == 3 and reasons[-1] == "length"
        assert ("good", [], True, False, 0, 0) in [tuple(r) for r in steps[0].new_requests]
        want = {m.rid for m in bad}
        errs = errors_for(collect(frontend, lambda ms: set(errors_for(ms)) >= want, thread))
        assert set(errs) == want and all(e.status == 400 for e in errs.values()), errs
        assert worker.inbox.num_dropped == len(frames)
        assert "ghost" in worker.pre_aborted
        assert "late" not in worker.pre_aborted  # consumed when "late" arrived
    assert not engine.has_unfinished()
    engine.block_manager.check_integrity()
    assert engine.generate([[1, 2, 3, 4, 5]], greedy) == [tokens]  # same as offline


def test_scheduler_refuses_a_kv_pool_smaller_than_the_context(run_dir, tiny_llama_dir):
    """Tokenizers accept requests up to the context length; a pool that cannot hold one
    would fail some of them later, so the scheduler refuses to start, saying what to set."""
    from common.config import ConfigError
    from scheduler_worker.engine import LLMEngine
    from scheduler_worker.worker import check_kv_pool

    config = make_config(run_dir, tiny_llama_dir)
    small = replace(config.engine, cache=replace(config.engine.cache, num_blocks=127))
    with pytest.raises(ConfigError, match=r"508 tokens .* context length \(512 tokens\)"):
        check_kv_pool(LLMEngine(small, tiny_llama_dir))
    check_kv_pool(LLMEngine(config.engine, tiny_llama_dir))  # 128 blocks of 4: fits


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
        return step_outputs(
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
        so(["empty-stop"], [pack_ids([5])], new=[("empty-stop", ["", ""], False, True, 0, 0)]),
        so(["dup", "dup"], [pack_ids([5]), pack_ids([6])], finish=["length", None]),
        so(["late"], [pack_ids([5])], new=[("nobody", ["x"], True, False, 0, 0)] * 3),
    ]
    good = so(
        ["good"],
        [pack_ids(ids)],
        finish=["length"],
        prompt=[3],
        out=[len(ids)],
        new=[("good", [], True, False, 0, 0)],
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
        # the scheduler's last word, as at its shutdown, still passed on; the drain at exit
        # then ends after its quiet period, not REPLICA_SILENT_S after a silent replica
        last = ComponentStatus("scheduler", 4242, "stopping", time.time())
        push.send(encode(last))
        collect(frontend, lambda ms: last in ms, thread)
