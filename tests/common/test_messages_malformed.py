"""The wire against frames it must refuse: malformed, mistyped, too deep, too large, and
random bytes, each only ever a WireError."""

from __future__ import annotations

import random

import msgpack
import pytest

from common.messages import (
    MAX_FRAME_BYTES,
    MAX_LIST,
    REGISTRY,
    WIRE_VERSION,
    AbortRequest,
    EngineStatus,
    GenerateRequest,
    StepOutputs,
    TextOutputs,
    TokenizeRequest,
    WireError,
    decode,
    encode,
)
from common.sampling_params import SamplingParams
from tests.common.wire_samples import ENGINE_FIELDS, GOOD_ABORT, SAMPLES, WIRE_PARAMS, raw


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
                *(
                    "r",
                    "chat",
                    None,
                    None,
                    deep,
                    WIRE_PARAMS,
                    0,
                    0,
                    0,
                    None,
                    None,
                    None,
                    None,
                    False,
                ),
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


def test_a_logprobs_column_is_checked_past_its_fast_paths():
    """StepOutputs.logprobs: rows of None pass as they are, and a top-N list of leaves is
    checked in one pass: a bad value inside it, a leaf nested too deep, or a bad row
    beside None rows still raise WireError."""
    from common.messages.base import MAX_DEPTH, check_json, checker_for

    column = checker_for(list[list | None])
    good = [None, [[-0.5, [[3, -0.5], [9, -1.25]]]], None]
    assert column(good) == good
    for bad in ([None, [[-0.5, [[3, object()]]]]], [None, 7], [None, [[-0.5, [[3, b"x"]]]]]):
        with pytest.raises(WireError):
            column(bad)
    deep: list = [[1, 2]]
    for _ in range(MAX_DEPTH - 1):
        deep = [deep]
    with pytest.raises(WireError):
        check_json(deep)
