"""Garbage on every socket: the frames and plumbing tests/test_garbage_frames.py sends.

Each worker that pulls from a socket runs its real loop in a thread, behind real ipc
sockets in a private run dir. The test pushes malformed frames (random bytes, msgpack of
the wrong shape, wrong version, unknown tag, wrong field types, truncated, multipart),
well-formed messages that do not belong on that socket, and well-formed messages with bad
content, then one valid message: the worker must still answer it, and must have dropped
exactly the malformed frames.
"""

from __future__ import annotations

import contextlib
import random
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import msgpack
import pytest
import zmq

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
)
from common.sampling_params import SamplingParams
from common.zmq_queue import PullQueue
from tests.common.wire_samples import step_outputs

HEARTBEAT_S = 0.2
WAIT_S = 20.0


def _packb(x) -> bytes:
    return msgpack.packb(x, use_bin_type=True)


# -- one sample of every message type -----------------------------------------------------


def samples() -> dict[type[Message], Message]:
    now = time.time()
    return {
        TokenizeRequest: TokenizeRequest(
            "s-tok", "completion", "Hi", None, None, SamplingParams(max_tokens=2)
        ),
        GenerateRequest: GenerateRequest("s-gen", pack_ids([1, 2]), SamplingParams(), now),
        AbortRequest: AbortRequest("s-abort", "test"),
        StepOutputs: step_outputs(
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
    return [encode(m) for cls, m in samples().items() if cls not in belong]


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
    # a message carrying SamplingParams, its struct mistyped (the wire checks each field)
    if "params" in type(sample).__dataclass_fields__:
        at = 2 + list(type(sample).__dataclass_fields__).index("params")
        frames += [_packb([v, tag, *fields[: at - 2], p, *fields[at - 1 :]]) for p in bad_params()]
    # multipart messages: one frame per message, always
    frames += [[b"a", b"b"], [valid, valid], [valid, b""]]
    return frames


def bad_params() -> list[object]:
    """SamplingParams as the wire carries it (an array of its fields), mistyped: each must
    fail to decode."""
    names = list(SamplingParams.__dataclass_fields__)
    good = msgpack.unpackb(encode(GenerateRequest("r", b"", SamplingParams(), 0.0)))[4]

    def with_(name: str, value: object) -> list:
        out = list(good)
        out[names.index(name)] = value
        return out

    return [
        {"max_tokens": 3},  # a map, as before the struct
        good[:-1],  # a field short
        [*good, 0],  # an unknown field
        with_("temperature", {"deep": [1, {"x": None}]}),
        with_("temperature", True),
        with_("stop", [None]),
        with_("seed", "x"),
        with_("skip_special_tokens", "yes"),
        with_("ignore_eos", 1),
        with_("max_tokens", 2.5),
        with_("logit_bias", {"5": 1.0}),  # a map: the wire carries [id, bias] pairs
        with_("logit_bias", [[5]]),
        with_("logit_bias", [["5", 1.0]]),
        with_("structured", _deep(40)),
    ]


def _deep(n: int):
    x: object = 1
    for _ in range(n):
        x = {"k": x}
    return x


# -- plumbing -----------------------------------------------------------------------------


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


def scheduler_under_test(config: Config, model_dir: Path):
    """A SchedulerWorker on `model_dir`, with the inboxes it sends to bound here: (worker,
    the frontend's PullQueue, the detokenizer's PullQueue). Close them with sockets()."""
    from scheduler_worker.engine import LLMEngine
    from scheduler_worker.worker import SchedulerWorker

    frontend = PullQueue(config.ipc.endpoint("frontend"), bind=True)
    detok = PullQueue(config.ipc.endpoint("detok"), bind=True)
    return SchedulerWorker(config, LLMEngine(config.engine, model_dir)), frontend, detok


class RawPush:
    """A PUSH socket that sends bytes as they are: no encoding, no checks. With `peer`, a
    ROUTER sending to that one DEALER (the tokenizer workers' inbox)."""

    def __init__(self, endpoint: str, bind: bool, peer: bytes | None = None) -> None:
        self.peer = peer
        self.socket = zmq.Context.instance().socket(zmq.PUSH if peer is None else zmq.ROUTER)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.setsockopt(zmq.SNDTIMEO, 10_000)  # a bound PUSH waits for its peer
        if peer is not None:
            self.socket.setsockopt(zmq.ROUTER_MANDATORY, 1)
        (self.socket.bind if bind else self.socket.connect)(endpoint)

    def send(self, frame: bytes | list[bytes]) -> None:
        frames = frame if isinstance(frame, list) else [frame]
        if self.peer is None:
            self.socket.send_multipart(frames)
            return
        deadline = time.monotonic() + 10
        while True:  # until the DEALER has connected
            try:
                self.socket.send_multipart([self.peer, *frames])
                return
            except zmq.ZMQError as e:
                if e.errno != zmq.EHOSTUNREACH or time.monotonic() > deadline:
                    raise
                time.sleep(0.01)

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
