from __future__ import annotations

import dataclasses
import random
import subprocess
import sys
from dataclasses import dataclass
from typing import ClassVar

import msgpack
import pytest

import common.messages as wire
from common.messages import (
    MAX_FRAME_BYTES,
    MAX_LIST,
    REGISTRY,
    WIRE_VERSION,
    AbortRequest,
    ComponentStatus,
    EngineStatus,
    GenerateRequest,
    Message,
    RequestError,
    StepOutput,
    StepOutputs,
    TextOutput,
    TextOutputs,
    TokenizerCall,
    TokenizeRequest,
    TokenizerReply,
    WireError,
    decode,
    encode,
    pack_ids,
    pack_step_outputs,
    pack_text_outputs,
    unpack_ids,
    unpack_step_outputs,
    unpack_text_outputs,
)
from common.sampling_params import SamplingParams

PARAMS = SamplingParams(max_tokens=8, stop=["\n"], seed=3)
IDS = pack_ids([0, 1, 49151, 2**31 - 1])

SAMPLES: list[Message] = [
    TokenizeRequest("r1", "completion", "Hello 你好 🎉", None, None, PARAMS),
    TokenizeRequest(
        "r2",
        "completion",
        None,
        IDS,
        None,
        SamplingParams(max_tokens=None, max_tokens_cap=16),
        4321,
    ),
    TokenizeRequest(
        "r3",
        "chat",
        None,
        None,
        [{"role": "user", "content": "hi"}, {"role": "system", "content": ""}],
        PARAMS,
        1,
    ),
    TokenizeRequest(  # chat with tools (frontend.tools.request)
        "r4",
        "chat",
        None,
        None,
        [{"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f"}}]}],
        PARAMS,
        tools=[{"type": "function", "function": {"name": "f", "parameters": {}}}],
    ),
    GenerateRequest("r1", IDS, PARAMS, 2.0, 4321),
    GenerateRequest("", b"", SamplingParams(), 0.0),
    AbortRequest("r1", "client_disconnect"),
    StepOutputs(
        7,
        ["a", "b"],
        [pack_ids([5]), b""],
        [None, "abort"],
        [3, 4],
        [1, 0],
        [[[-0.5, [[5, -0.5], [6, -1.25]]]], None],
        [("a", ["</s>", "\n\n"], True, False, 0), ("b", [], False, True, 0)],
        [{"arrival": 1.0, "first_token": 2.5}, None],
        123.25,
    ),
    StepOutputs(0, [], [], [], [], [], None, [], None, 0.0),
    EngineStatus("ready", 0, 0, 0.0, 100, 100, 0, 0, "smollm2", 8192, 49152, 1.0),
    EngineStatus("heartbeat", 3, 1, 0.25, 75, 100, 640, 320, "m", 2048, 512, 2.0),
    EngineStatus(
        "heartbeat",
        3,
        1,
        0.25,
        75,
        100,
        640,
        320,
        "m",
        2048,
        512,
        2.0,
        {"forward": 1.5, "sample": 0.25, "schedule": 0.0, "ipc": 0.125},
        device="NVIDIA H200",
        gpus=["2", "3"],
    ),
    TextOutputs(
        ["a", "b"],
        ["Hé", ""],
        ["stop", None],
        [3, 4],
        [2, 1],
        [IDS, b""],
        None,
        None,
        ["\n", None],
        5.0,
    ),
    TextOutputs([], [], [], [], [], [], [], [], [], 0.0),
    RequestError("r9", 400, "max_tokens: must be >= 1", "invalid_request_error", "max_tokens"),
    RequestError("r9", 500, "", "internal_error", None),
    ComponentStatus("detok", 1234, "stopping", 3.0),
    ComponentStatus("tokenizer", 77, "ready", 3.0, ("smollm2", 49152, 8192, 0)),
    TokenizerCall("c1", "tokenize", {"prompt": "Hé", "add_special_tokens": True}),
    TokenizerReply("c1", 200, {"count": 2, "tokens": [1, 2], "token_strs": None}),
    TokenizerReply("c2", 400, {"message": "tokens: bad", "param": "tokens"}),
    StepOutputs(
        1,
        ["a"],
        [pack_ids([5])],
        [None],
        [2],
        [1],
        None,
        [],
        None,
        1.0,
        None,
        [[[7, None, []], [8, -0.5, [[8, -0.5], [9, -1.0]]]]],
    ),
]


def raw(*items) -> bytes:
    return msgpack.packb(list(items), use_bin_type=True)


def fields_of(msg: Message) -> list:
    return [getattr(msg, f.name) for f in dataclasses.fields(msg)]


def test_registry_covers_every_message_type():
    assert {type(m) for m in SAMPLES} == set(REGISTRY.values())
    assert all(REGISTRY[cls.TAG] is cls for cls in REGISTRY.values())


@pytest.mark.parametrize("msg", SAMPLES, ids=lambda m: type(m).__name__)
def test_round_trip(msg):
    frame = encode(msg)
    assert isinstance(frame, bytes)
    out = decode(frame)
    assert type(out) is type(msg) and out == msg
    assert decode(memoryview(frame)) == msg


def test_the_engine_fields_are_a_whole_engine_status():
    status = decode(raw(WIRE_VERSION, EngineStatus.TAG, *ENGINE_FIELDS))
    assert (status.block_size, status.device, status.gpus) == (16, "NVIDIA H200", ["2"])
    assert (status.spec, status.spec_method) == ({"verify_steps": 3}, "ngram")


def test_float_field_accepts_int_and_decodes_as_float():
    out = decode(raw(WIRE_VERSION, ComponentStatus.TAG, "x", 1, "ready", 7, None))
    assert out.time == 7.0 and type(out.time) is float


def test_messages_are_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        SAMPLES[0].rid = "other"


def test_duplicate_tag_is_refused():
    @dataclass(frozen=True, slots=True)
    class Clash(Message):
        TAG: ClassVar[int] = AbortRequest.TAG
        x: int

    with pytest.raises(ValueError, match="duplicate"):
        wire.register(Clash)
    assert REGISTRY[AbortRequest.TAG] is AbortRequest


def test_encode_refuses_schema_violations():
    with pytest.raises(WireError, match="AbortRequest.reason"):
        encode(AbortRequest("r", 5))
    with pytest.raises(WireError):
        encode(GenerateRequest("r", [1, 2], {}, 0.0))  # ids not packed


GOOD_ABORT = [WIRE_VERSION, AbortRequest.TAG, "rid", "why"]
WIRE_PARAMS = msgpack.unpackb(encode(GenerateRequest("r", b"", SamplingParams(), 0.0)))[4]
ENGINE_FIELDS = ["ready", 0, 0, 0.0, 1, 1, 0, 0, "m", 16, 32, 0.0, {}, 0, 1, None, None, 0, 16, {}]
ENGINE_FIELDS += ["NVIDIA H200", ["2"]]  # device, gpus
ENGINE_FIELDS += [{"verify_steps": 3}, "ngram"]  # spec, spec_method


@pytest.mark.parametrize(
    "frame",
    [
        b"",
        b"\xc1",  # never-used msgpack byte
        b"\x93\x01",  # truncated array
        raw(*GOOD_ABORT) + b"\x00",  # trailing data
        msgpack.packb({"v": 1, "tag": 3}),  # a map, not an array
        msgpack.packb("just a string"),
        raw(WIRE_VERSION),
        raw(WIRE_VERSION + 1, AbortRequest.TAG, "rid", "why"),
        raw("1", AbortRequest.TAG, "rid", "why"),
        raw(True, AbortRequest.TAG, "rid", "why"),
        raw(WIRE_VERSION, 999, "rid", "why"),
        raw(WIRE_VERSION, "AbortRequest", "rid", "why"),
        raw(WIRE_VERSION, AbortRequest.TAG, "rid"),  # missing field
        raw(WIRE_VERSION, AbortRequest.TAG, "rid", "why", "extra"),
        raw(WIRE_VERSION, AbortRequest.TAG, 5, "why"),  # int where str
        raw(WIRE_VERSION, AbortRequest.TAG, b"rid", "why"),  # bytes where str
        raw(WIRE_VERSION, AbortRequest.TAG, None, "why"),  # None where str
        raw(WIRE_VERSION, EngineStatus.TAG, "ready", "0", *ENGINE_FIELDS[2:]),  # str where int
        raw(WIRE_VERSION, EngineStatus.TAG, "ready", True, *ENGINE_FIELDS[2:]),  # bool where int
        raw(WIRE_VERSION, EngineStatus.TAG, "ready", 0, 0, "0.5", *ENGINE_FIELDS[4:]),
        raw(WIRE_VERSION, EngineStatus.TAG, "ready", 1.0, *ENGINE_FIELDS[2:]),  # float where int
        raw(WIRE_VERSION, EngineStatus.TAG, *ENGINE_FIELDS[:-3], "2", *ENGINE_FIELDS[-2:]),  # gpus
        raw(WIRE_VERSION, EngineStatus.TAG, *ENGINE_FIELDS[:-2], [], "ngram"),  # spec: a list
        raw(
            WIRE_VERSION, GenerateRequest.TAG, "r", "ids", WIRE_PARAMS, 0.0, 0, 0
        ),  # str where bytes
        raw(
            WIRE_VERSION, GenerateRequest.TAG, "r", b"", WIRE_PARAMS, 0.0, 0, True
        ),  # bool where int
        raw(
            WIRE_VERSION, GenerateRequest.TAG, "r", b"", [], 0.0, 0, 0
        ),  # the struct's fields missing
        raw(WIRE_VERSION, GenerateRequest.TAG, "r", b"", {}, 0.0, 0, 0),  # a map where the struct
        raw(WIRE_VERSION, GenerateRequest.TAG, "r", b"", {"x": b"\x00"}, 0.0, 0, 0),
        raw(
            WIRE_VERSION,
            GenerateRequest.TAG,
            "r",
            b"",
            {"x": {"y": {}}},
            0.0,
            msgpack.ExtType(1, b"z"),
        ),
        msgpack.packb([WIRE_VERSION, GenerateRequest.TAG, "r", b"", {1: 2}, 0.0, 0, 0]),
        raw(
            WIRE_VERSION,
            TextOutputs.TAG,
            ["a", 1],
            [""] * 2,
            [None] * 2,
            [0, 0],
            [0, 0],
            [b"", b""],
            None,
            None,
            [None, None],
            0.0,
            0,
        ),  # list of wrong element type
        raw(
            WIRE_VERSION,
            TextOutputs.TAG,
            "a",
            [""],
            [None],
            [0],
            [0],
            [b""],
            None,
            None,
            [None],
            0.0,
            0,
        ),
        raw(
            WIRE_VERSION,
            TextOutputs.TAG,
            ["a"],
            [""],
            ["stop"],
            [0],
            [0],
            [b""],
            None,
            None,
            [None],
            0.0,
            1,
            2,
        ),
        raw(
            WIRE_VERSION,
            StepOutputs.TAG,
            0,
            [],
            [],
            [],
            [],
            [],
            None,
            [["a", ["x"], True]],
            None,
            0.0,
            None,
            0,
            None,
        ),  # new_requests tuple too short
        raw(
            WIRE_VERSION,
            StepOutputs.TAG,
            0,
            [],
            [],
            [],
            [],
            [],
            None,
            [["a", "x", True, False]],
            None,
            0.0,
            None,
            0,
            None,
        ),  # stop strings not a list
        raw(
            WIRE_VERSION,
            StepOutputs.TAG,
            0,
            [],
            [],
            [],
            [],
            [],
            [[[1]]],
            [],
            [5],
            0.0,
            None,
            0,
            None,
        ),  # timings entry neither dict nor None
    ],
    ids=lambda f: f[:12].hex(),
)
def test_malformed_frames_raise_wire_error(frame):
    with pytest.raises(WireError):
        decode(frame)


def test_wrong_container_types():
    with pytest.raises(WireError):
        decode("a str frame")  # type: ignore[arg-type]
    deep: list = []
    for _ in range(100):
        deep = [deep]
    with pytest.raises(WireError, match="deeper"):
        decode(
            raw(
                WIRE_VERSION,
                TokenizeRequest.TAG,
                *("r", "chat", None, None, deep, WIRE_PARAMS, 0, 0, 0, None, None, None),
            )
        )


def test_oversize_frame_and_list():
    with pytest.raises(WireError, match="exceeds"):
        decode(b"\x00" * (MAX_FRAME_BYTES + 1))
    big = raw(
        WIRE_VERSION,
        TextOutputs.TAG,
        [""] * (MAX_LIST + 1),
        [],
        [],
        [],
        [],
        [],
        None,
        None,
        [],
        0.0,
        0,
    )
    with pytest.raises(WireError):
        decode(big)
    with pytest.raises(WireError, match="exceeds"):
        encode(GenerateRequest("r", b"\x00" * MAX_FRAME_BYTES, SamplingParams(), 0.0))


def test_pack_ids_round_trip_and_layout():
    ids = [0, 1, 255, 256, 49151, 2**31 - 1]
    data = pack_ids(ids)
    assert len(data) == 4 * len(ids)
    assert data[4:8] == b"\x01\x00\x00\x00"  # little-endian int32
    assert unpack_ids(data) == ids
    assert pack_ids([]) == b"" and unpack_ids(b"") == []


def test_batch_helpers_round_trip_and_refuse_lists_that_do_not_line_up():
    steps = [
        StepOutput("a", pack_ids([5]), None, 3, 1),
        StepOutput("b", b"", "stop", 4, 2, [[-0.5, [[5, -0.5]]]], {"x": 1.0}, 9),
    ]
    msg = pack_step_outputs(7, steps, [("a", ["\n"], True, False, 0)])
    assert msg.logprobs == [None, [[-0.5, [[5, -0.5]]]]] and msg.stop_token_ids == [None, 9]
    assert unpack_step_outputs(decode(encode(msg))) == steps
    quiet = pack_step_outputs(8, steps[:1], [])  # optional lists go only when one is set
    assert (quiet.logprobs, quiet.timings, quiet.stop_token_ids) == (None, None, None)
    texts = [
        TextOutput("a", "Hi", None, 3, 1, pack_ids([5])),
        TextOutput("b", "", "stop", 4, 2, b"", None, {"x": 1.0}, "\n"),
    ]
    assert unpack_text_outputs(decode(encode(pack_text_outputs(texts)))) == texts
    with pytest.raises(WireError, match="finish_reasons, logprobs not as long as rids"):
        unpack_step_outputs(dataclasses.replace(msg, finish_reasons=[None], logprobs=[None]))
    with pytest.raises(WireError, match="timings"):
        unpack_text_outputs(dataclasses.replace(pack_text_outputs(texts), timings=[None]))


@pytest.mark.parametrize("bad", [[-1], [2**31], ["1"], [1.5]])
def test_pack_ids_rejects_out_of_range(bad):
    with pytest.raises(WireError):
        pack_ids(bad)


@pytest.mark.parametrize("data", [b"\x00", b"\x00" * 5, b"\xff\xff\xff\xff"])
def test_unpack_ids_rejects_bad_bytes(data):
    with pytest.raises(WireError):
        unpack_ids(data)


def test_random_bytes_only_ever_raise_wire_error():
    # (hypothesis is not installed here; a seeded fuzz loop does the same job)
    rng = random.Random(0)
    frames = [encode(m) for m in SAMPLES]
    for i in range(3000):
        if i % 2:  # mutate a valid frame: flip, truncate or splice bytes
            f = bytearray(rng.choice(frames))
            for _ in range(rng.randint(1, 4)):
                f[rng.randrange(len(f))] = rng.randrange(256)
            f = bytes(f[: rng.randint(0, len(f))]) if rng.random() < 0.3 else bytes(f)
        else:
            f = rng.randbytes(rng.randint(0, 64))
        try:
            msg = decode(f)
        except WireError:
            continue
        assert type(msg) in REGISTRY.values()
        assert decode(encode(msg)) == msg  # whatever decodes is a valid message


def test_every_field_of_each_sample_is_checked():
    # Replace each field in turn by a value of an impossible type: decoding must fail.
    for msg in SAMPLES:
        values = fields_of(msg)
        for i in range(len(values)):
            bad = list(values)
            bad[i] = object
            with pytest.raises(WireError):
                encode(type(msg)(*bad))


def test_light_modules_import_no_torch():
    code = (
        "import sys, common.messages, common.zmq_queue, detok_worker.incremental\n"
        "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
