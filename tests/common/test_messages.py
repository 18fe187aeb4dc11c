"""The wire: every message type round-trips, the registry and its tags, encode's schema
checks, and the id and batch packing helpers."""

from __future__ import annotations

import dataclasses
import struct
import subprocess
import sys
from dataclasses import dataclass
from typing import ClassVar

import pytest

import common.messages as wire
from common.messages import (
    REGISTRY,
    WIRE_VERSION,
    AbortRequest,
    ComponentStatus,
    EngineStatus,
    GenerateRequest,
    Message,
    StepOutput,
    TextOutput,
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
from tests.common.wire_samples import ENGINE_FIELDS, SAMPLES, fields_of, raw


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


def test_every_field_of_each_sample_is_checked():
    # Replace each field in turn by a value of an impossible type: decoding must fail.
    for msg in SAMPLES:
        values = fields_of(msg)
        for i in range(len(values)):
            bad = list(values)
            bad[i] = object
            with pytest.raises(WireError):
                encode(type(msg)(*bad))


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
    msg = pack_step_outputs(7, steps, [("a", ["\n"], True, False, 0, 0)])
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


def test_light_modules_import_no_torch():
    code = (
        "import sys, common.messages, common.zmq_queue, detok_worker.incremental\n"
        "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_packed_token_logprobs_read_back_and_refuse_bytes_that_do_not_make_a_column():
    """StepOutputs.token_logprobs (wire 14): one token's logprobs a row, packed; read back
    as the lists; a blob whose counts, rows or length do not line up is a WireError."""
    from common.messages.scheduler_detok import pack_token_logprobs, unpack_token_logprobs

    data = pack_token_logprobs([1, 3], [-0.5, -2.0], [[5, 6], []], [[-0.5, -1.25], []])
    want = [None, [[-0.5, [[5, -0.5], [6, -1.25]]]], None, [[-2.0, []]]]
    assert unpack_token_logprobs(data, 4) == want
    steps = [StepOutput(r, pack_ids([1]), None, 3, 1) for r in "abcd"]
    msg = dataclasses.replace(pack_step_outputs(7, steps, []), token_logprobs=data)
    assert [s.logprobs for s in unpack_step_outputs(decode(encode(msg)))] == want
    k2 = struct.pack("<I", 2)
    bad = [
        b"\x01",  # no count
        data[:-1],  # a byte short
        data + b"\x00" * 12,  # a top-N more than the counts say
        k2 + struct.pack("<2i2i2d", 3, 1, 0, 0, 0.0, 0.0),  # rows not increasing
        k2 + struct.pack("<2i2i2d", 1, 4, 0, 0, 0.0, 0.0),  # a row past the step
        k2 + struct.pack("<2i2i2d", 0, 1, -1, 0, 0.0, 0.0),  # a negative count
        struct.pack("<I", 5),  # more rows than the step
    ]
    for blob in bad:
        with pytest.raises(WireError):
            unpack_token_logprobs(blob, 4)
    both = dataclasses.replace(msg, logprobs=[None] * 4)
    with pytest.raises(WireError, match="both"):
        unpack_step_outputs(both)
