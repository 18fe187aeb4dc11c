"""Garbage on every socket: no frame a peer can send kills a worker.

Each worker that pulls from a socket runs its real loop in a thread, behind real ipc
sockets in a private run dir. The test pushes malformed frames (random bytes, msgpack of
the wrong shape, wrong version, unknown tag, wrong field types, truncated, multipart),
well-formed messages that do not belong on that socket, and well-formed messages with bad
content, then one valid message: the worker must still answer it, and must have dropped
exactly the malformed frames.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import msgpack
import pytest
import zmq
from tokenizers import Tokenizer

from common.config import (
    CacheConfig,
    Config,
    EngineConfig,
    IPCConfig,
    ModelConfig,
    SchedulerConfig,
)
from common.messages import (
    WIRE_VERSION,
    AbortRequest,
    ComponentStatus,
    EngineStatus,
    GenerateRequest,
    Message,
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

pytestmark = pytest.mark.timeout(60)

HEARTBEAT_S = 0.2
WAIT_S = 20.0


def _packb(x) -> bytes:
    return msgpack.packb(x, use_bin_type=True)


# -- one sample of every message type -----------------------------------------------------


def _samples() -> dict[type[Message], Message]:
    now = time.time()
    return {
        TokenizeRequest: TokenizeRequest("s-tok", "completion", "Hi", None, None, {}, now, False),
        GenerateRequest: GenerateRequest("s-gen", pack_ids([1, 2]), {}, now, now, False),
        AbortRequest: AbortRequest("s-abort", "test"),
        StepOutputs: StepOutputs(
            0, ["s-step"], [pack_ids([5])], [None], [2], [1], None, [], None, now
        ),
        EngineStatus: EngineStatus("heartbeat", 0, 0, 0.0, 1, 1, 0, 0, "m", 16, 16, now),
        TextOutputs: TextOutputs(
            ["s-text"], ["x"], [None], [1], [1], [pack_ids([5])], None, None, [None], now
        ),
        RequestError: RequestError("s-err", 400, "bad", "invalid_request_error", None),
        ComponentStatus: ComponentStatus("detok", 1, "heartbeat", now),
    }


def misrouted(*belong: type[Message]) -> list[bytes]:
    """Valid frames of every message type that does not belong on this socket."""
    return [encode(m) for cls, m in _samples().items() if cls not in belong]


def malformed(sample: Message) -> list[bytes | list[bytes]]:
    """Frames that must not decode at all (each adds one to the PullQueue's num_dropped).
    `sample` is a message that belongs on the socket: variations of it are the nastiest."""
    valid = encode(sample)
    fields = msgpack.unpackb(valid)[2:]
    tag, v = sample.TAG, WIRE_VERSION
    rng = random.Random(1234)
    frames: list[bytes | list[bytes]] = [rng.randbytes(n) for n in (1, 2, 7, 64, 1000, 4096)]
    frames += [b"", b"\x00", b"\xc1", b"\xff" * 16]
    # msgpack, but not [version, tag, ...]
    frames += [
        _packb(x)
        for x in ({"rid": "x"}, "frame", 42, None, 3.5, True, b"bytes", [], [v], [[v, tag]])
    ]
    # wrong version
    frames += [_packb([ver, tag, *fields]) for ver in (v + 1, 0, -1, True, str(v), float(v), None)]
    # unknown or mistyped tag
    frames += [_packb([v, t, *fields]) for t in (999, -1, 2**40, str(tag), float(tag), None, [tag])]
    frames += [_packb([v, True, *fields])]  # True == 1, but a bool is not a tag
    # the right tag with the wrong number of fields
    frames += [_packb([v, tag]), _packb([v, tag, *fields[:-1]]), _packb([v, tag, *fields, 0])]
    # truncated / trailing bytes
    frames += [valid[:-1], valid[: len(valid) // 2], valid + b"\x00", valid + valid]
    # msgpack features the wire never uses, and hostile lengths and nesting
    frames += [
        _packb(msgpack.ExtType(1, b"x")),
        _packb([v, tag, msgpack.ExtType(1, b"x")]),
        b"\x91" * 5000 + b"\xc0",  # arrays nested 5000 deep
        b"\xdd\xff\xff\xff\xff",  # array of 4G elements, no body
        b"\xdf\xff\xff\xff\xff",  # map of 4G entries
        b"\xdb\xff\xff\xff\xff" + b"a",  # str of 4 GB declared
        b"\x93\x01\x01\xa2\xff\xfe",  # [1, 1, <invalid UTF-8>]
        _packb({1: 2}),  # non-str map key
    ]
    # every registered tag, each with wrong field types
    now = time.time()
    frames += [
        _packb([v, GenerateRequest.TAG, 123, "notbytes", [], "x", None, 1]),
        _packb([v, GenerateRequest.TAG, "r", [1, 2, 3], {}, now, now, False]),  # ids as a list
        _packb([v, GenerateRequest.TAG, "r", pack_ids([1]), {}, "t", now, False]),
        _packb([v, GenerateRequest.TAG, "r", pack_ids([1]), _deep(40), now, now, False]),
        _packb([v, TokenizeRequest.TAG, "r", "completion", 5, None, None, {}, now, False]),
        _packb([v, TokenizeRequest.TAG, "r", "chat", None, None, "msgs", {}, now, False]),
        _packb([v, TokenizeRequest.TAG, "r", "completion", "x", None, None, {}, True, False]),
        _packb([v, TokenizeRequest.TAG, "r", "completion", "x", None, None, {}, now, 1]),
        _packb([v, TokenizeRequest.TAG, "r", "completion", "x", None, None, [], now, False]),
        _packb([v, AbortRequest.TAG, None, "x"]),
        _packb([v, AbortRequest.TAG, b"rid", "x"]),
        _packb([v, StepOutputs.TAG, 0, "rids", [], [], [], [], None, [], None, now]),
        _packb([v, StepOutputs.TAG, 0, ["r"], [b""], [None], [1], [1], None, [["r"]], None, now]),
        _packb([v, StepOutputs.TAG, 0, ["r"], [b""], [None], [1], [1.5], None, [], None, now]),
        _packb([v, TextOutputs.TAG, ["r"], [b"x"], [None], [1], [1], [b""], None, None, [None], 0]),
        _packb([v, EngineStatus.TAG, "ready", 0, 0, "0", 1, 1, 0, 0, "m", 16, 16, now]),
        _packb([v, RequestError.TAG, "r", "400", "m", "t", None]),
        _packb([v, ComponentStatus.TAG, "detok", "pid", "ready", now]),
    ]
    # multipart messages: one frame per message, always
    frames += [[b"a", b"b"], [valid, valid], [valid, b""]]
    return frames


def _deep(n: int):
    x: object = 1
    for _ in range(n):
        x = {"k": x}
    return x


# -- plumbing -----------------------------------------------------------------------------


@pytest.fixture
def run_dir() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(dir="/tmp", prefix="zsg-"))  # 0700, and short: ipc paths
    yield d
    shutil.rmtree(d, ignore_errors=True)


def make_config(run_dir: Path, model: str | Path = "unused") -> Config:
    return Config(
        engine=EngineConfig(
            model=ModelConfig(model=str(model), dtype="float32", device="cpu"),
            cache=CacheConfig(block_size=4, num_blocks=128),  # the tiny models' 512 tokens
            scheduler=SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=64),
        ),
        ipc=IPCConfig(run_dir=str(run_dir)),
        heartbeat_s=HEARTBEAT_S,
    )


class RawPush:
    """A PUSH socket that sends bytes as they are: no encoding, no checks."""

    def __init__(self, endpoint: str, bind: bool) -> None:
        self.socket = zmq.Context.instance().socket(zmq.PUSH)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.setsockopt(zmq.SNDTIMEO, 10_000)  # a bound PUSH waits for its peer
        (self.socket.bind if bind else self.socket.connect)(endpoint)

    def send(self, frame: bytes | list[bytes]) -> None:
        if isinstance(frame, list):
            self.socket.send_multipart(frame)
        else:
            self.socket.send(frame)

    def send_all(self, frames) -> None:
        for f in frames:
            self.send(f)

    def close(self) -> None:
        self.socket.close(linger=0)


@contextlib.contextmanager
def sockets(*queues) -> Iterator[None]:
    try:
        yield
    finally:
        for q in queues:
            q.close()


@contextlib.contextmanager
def running(worker) -> Iterator[threading.Thread]:
    """worker.run() in a thread; stopped, joined and checked for an exception at exit."""
    errors: list[BaseException] = []

    def target() -> None:
        try:
            worker.run()
        except BaseException as e:  # noqa: BLE001 - reported by the test below
            errors.append(e)

    t = threading.Thread(target=target, name=f"{type(worker).__name__}-under-test", daemon=True)
    t.errors = errors  # type: ignore[attr-defined]  # for collect()'s message
    t.start()
    try:
        yield t
    finally:
        worker.stop()
        t.join(timeout=15)
    assert not t.is_alive(), "worker did not stop"
    assert not errors, f"worker loop died: {errors[0]!r}"


def collect(
    pull: PullQueue,
    until: Callable[[list[Message]], bool],
    worker: threading.Thread | None = None,
    timeout_s: float = WAIT_S,
) -> list[Message]:
    """Everything `pull` receives until `until(received so far)` holds; fails at once if
    the worker's thread is gone."""
    got: list[Message] = []
    deadline = time.monotonic() + timeout_s
    while not until(got):
        if worker is not None and not worker.is_alive():
            pytest.fail(f"the worker loop died: {getattr(worker, 'errors', None)!r}")
        left = deadline - time.monotonic()
        assert left > 0, f"timed out; received {[type(m).__name__ for m in got]}"
        got.extend(pull.get_batch(timeout_ms=int(min(left, 0.5) * 1000)))
    return got


def errors_for(msgs: list[Message]) -> dict[str, RequestError]:
    return {m.rid: m for m in msgs if isinstance(m, RequestError)}


def test_malformed_frames_really_are_malformed():
    """The fixture itself: every frame of `malformed` fails to decode."""
    from common.messages import WireError, decode

    for sample in _samples().values():
        for frame in malformed(sample):
            if isinstance(frame, list):
                continue  # multipart: rejected by the queue, not the codec
            with pytest.raises(WireError):
                decode(frame)


# -- tokenizer worker ---------------------------------------------------------------------


def test_tokenizer_worker_survives_garbage(run_dir, default_model_dir):
    from tokenizer_worker.worker import Tokenization, TokenizerWorker

    config = make_config(run_dir)
    ipc = config.ipc
    frontend = PullQueue(ipc.endpoint("frontend"), bind=True)
    scheduler = PullQueue(ipc.endpoint("scheduler"), bind=True)
    push = RawPush(ipc.endpoint("tokenizer"), bind=True)
    worker = TokenizerWorker(config, Tokenization(default_model_dir, max_model_len=64))
    now = time.time()

    def tr(rid, kind="completion", prompt="Hi", ids=None, messages=None, params=None):
        return TokenizeRequest(rid, kind, prompt, ids, messages, params or {}, now, False)

    bad = [
        tr("bad-kind", kind="bogus"),
        tr("bad-temperature", params={"temperature": -1}),
        tr("bad-unknown-param", params={"nope": 1}),
        tr("bad-param-type", params={"temperature": {"deep": [1, {"x": None}]}}),
        tr("bad-stop", params={"stop": [None]}),
        tr("bad-seed", params={"seed": "x"}),
        tr("bad-flag", params={"skip_special_tokens": "yes"}),
        tr("bad-flag2", params={"ignore_eos": 1}),
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
        assert got[0].params["max_tokens"] == 3
        want = {m.rid for m in bad}
        errs = errors_for(collect(frontend, lambda ms: set(errors_for(ms)) >= want, thread))
        assert set(errs) == want
        assert all(e.status == 400 for e in errs.values()), errs
        assert worker.inbox.num_dropped == len(frames)
    assert worker.num_done == 2


# -- detok worker -------------------------------------------------------------------------


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
            0, rids, new_ids, finish if finish is not None else [None] * n,
            prompt if prompt is not None else [1] * n, out if out is not None else [1] * n,
            logprobs, list(new), None, now,
        )  # fmt: skip

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
    good = so(["good"], [pack_ids(ids)], finish=["length"], prompt=[3], out=[len(ids)],
              new=[("good", [], True, False)])  # fmt: skip
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


# -- scheduler worker ---------------------------------------------------------------------


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
    greedy = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True).to_dict()

    def gr(rid, ids=None, params=None):
        ids = pack_ids([1, 2, 3, 4, 5]) if ids is None else ids
        return GenerateRequest(rid, ids, greedy if params is None else params, now, now, False)

    bad = [
        gr("bad-ids-bytes", ids=b"\x01\x02\x03"),
        gr("bad-ids-empty", ids=b""),
        gr("bad-ids-negative", ids=b"\xff\xff\xff\xff"),
        gr("bad-ids-vocab", ids=pack_ids([1, engine.vocab_size])),
        gr("bad-unknown-param", params={"bogus": 1}),
        gr("bad-max-tokens-type", params={"max_tokens": "3"}),
        gr("bad-temperature", params={"temperature": -1}),
        gr("bad-context", params={"max_tokens": 10**6}),
        gr("bad-stop", params={"stop": "x"}),
        gr("bad-logprobs", params={"logprobs": 99}),
        gr("bad-flag", params={"skip_special_tokens": "yes"}),
        gr("bad-flag2", params={"include_stop_str_in_output": 0}),
        gr("bad-flag3", params={"ignore_eos": None}),
        gr("bad-nested", params={"temperature": [{"a": {"b": None}}]}),
    ]
    frames = malformed(gr("sample"))
    with sockets(frontend, detok, push), running(worker) as thread:
        push.send_all(frames)
        push.send_all(misrouted(GenerateRequest, AbortRequest))
        push.send_all(encode(m) for m in bad)
        # forged aborts: unknown rids, a rid that failed above, and one whose request
        # arrives after its abort (it must never run)
        for rid in ("ghost", "bad-flag", "late", "", "x" * 10_000):
            push.send(encode(AbortRequest(rid, "forged")))
        push.send(encode(gr("late")))
        push.send(encode(gr("good")))

        def good_done(ms):
            return any(
                isinstance(m, StepOutputs)
                and "good" in m.rids
                and m.finish_reasons[m.rids.index("good")] is not None
                for m in ms
            )

        steps = collect(detok, good_done, thread)
        assert thread.is_alive()
        assert all(isinstance(m, StepOutputs) for m in steps)
        tokens, reasons = [], []
        for m in steps:
            assert set(m.rids) == {"good"}, m.rids  # nothing bad, aborted or forged ran
            tokens += unpack_ids(m.new_token_ids[0])
            reasons.append(m.finish_reasons[0])
        assert len(tokens) == 3 and reasons[-1] == "length"
        assert ("good", [], True, False) in [tuple(r) for r in steps[0].new_requests]
        want = {m.rid for m in bad}
        errs = errors_for(collect(frontend, lambda ms: set(errors_for(ms)) >= want, thread))
        assert set(errs) == want and all(e.status == 400 for e in errs.values()), errs
        assert worker.inbox.num_dropped == len(frames)
        assert "ghost" in worker.pre_aborted
        assert "late" not in worker.pre_aborted  # consumed when "late" arrived
    assert not engine.has_unfinished()
    engine.block_manager.check_integrity()
    params = SamplingParams(**greedy)
    assert engine.generate([[1, 2, 3, 4, 5]], params) == [tokens]  # same as offline


# -- the frontend's inbox -----------------------------------------------------------------


def test_frontend_inbox_survives_garbage(run_dir):
    from frontend.engine_client import EngineClient
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
            push.send_all(encode(m) for m in [
                TextOutputs(["r1", "r2"], ["a"], [None], [1], [1], [b""], None, None, [None], now),
                TextOutputs(["r1"], ["a"], [None], [1], [1], [b""], [None, None], None, [None], now),
                TextOutputs(["nobody"], ["a"], ["stop"], [1], [1], [b""], None, None, [None], now),
                RequestError("nobody", 400, "x", "invalid_request_error", None),
                RequestError("r2", 999, "odd status", "server_error", None),
                EngineStatus("weird", -1, -1, 7.5, -1, 0, -5, -9, "", 0, 0, -1.0),
                ComponentStatus("martian", -1, "ready", now),
                ComponentStatus("detok", 4343, "??", now),  # same pid: a new one = restart
            ])  # fmt: skip
            pack5 = pack_ids([5])
            good = [
                EngineStatus("ready", 0, 0, 0.0, 64, 64, 0, 0, "m", 64, 512, now),
                ComponentStatus("tokenizer", 4242, "ready", now),
                ComponentStatus("detok", 4343, "ready", now),
                TextOutputs(["r1"], ["hi"], ["length"], [2], [1], [pack5], None, None, [None], now),
            ]
            push.send_all(encode(m) for m in good)
            await client.liveness.wait_ready(WAIT_S, stopped=lambda: False)
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
