"""The columnar codec of the batch messages (StepOutputs, TextOutputs): random records
(empty batches, None in every optional field, unicode, empty strings and lists) go
through pack -> encode -> decode -> unpack unchanged, and the frame is byte for byte the
one built column by column by hand (the wire did not change with the codec)."""

from __future__ import annotations

import dataclasses

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from common.messages import (
    WIRE_VERSION,
    StepOutput,
    StepOutputs,
    TextOutput,
    TextOutputs,
    WireError,
    decode,
    encode,
    pack_ids,
    pack_step_outputs,
    pack_text_outputs,
    unpack_step_outputs,
    unpack_text_outputs,
)
from common.messages.base import Message
from common.messages.columnar import Columnar

text = st.text(max_size=12)  # any unicode, surrogates excluded by hypothesis' default
ids = st.lists(st.integers(0, 2**31 - 1), max_size=5).map(pack_ids)
small = st.integers(0, 2**31 - 1)
reason = st.none() | st.sampled_from(["stop", "length", "abort"])
finite = st.floats(allow_nan=False, allow_infinity=False)
top = st.lists(st.tuples(small, finite).map(list), max_size=3)
logprobs = st.none() | st.lists(st.tuples(finite, top).map(list), max_size=3)
timings = st.none() | st.dictionaries(text, st.none() | finite | small, max_size=3)
prompt_lps = st.none() | st.lists(st.tuples(small, st.none() | finite, top).map(list), max_size=3)

step_output = st.builds(
    StepOutput, text, ids, reason, small, small, logprobs, timings, st.none() | small, prompt_lps
)
text_output = st.builds(
    TextOutput,
    text,
    text,
    reason,
    small,
    small,
    ids,
    logprobs,
    timings,
    st.none() | text | small,
    prompt_lps,
)


def _optional(values: list) -> list | None:
    return values if any(v is not None for v in values) else None


def _frame(msg) -> list:
    return msgpack.unpackb(encode(msg), raw=False)


@settings(max_examples=200, deadline=None)
@given(st.lists(step_output, max_size=6), st.integers(0, 2**31 - 1))
def test_step_outputs_round_trip_and_keep_their_wire_bytes(outputs, step):
    msg = pack_step_outputs(
        step, outputs, [("r", ["\n", "é"], True, False, 0, 0)], 2, "ipc:///x", [3, 1]
    )
    assert unpack_step_outputs(decode(encode(msg))) == outputs
    by_hand = StepOutputs(
        step=step,
        rids=[o.rid for o in outputs],
        new_token_ids=b"".join(o.new_token_ids for o in outputs),
        num_new_tokens=(
            None
            if all(len(o.new_token_ids) == 4 for o in outputs)
            else pack_ids([len(o.new_token_ids) // 4 for o in outputs])
        ),
        finish_reasons=_optional([o.finish_reason for o in outputs]),
        num_prompt_tokens=pack_ids([o.num_prompt_tokens for o in outputs]),
        num_output_tokens=pack_ids([o.num_output_tokens for o in outputs]),
        logprobs=_optional([o.logprobs for o in outputs]),
        new_requests=[("r", ["\n", "é"], True, False, 0, 0)],
        timings=_optional([o.timings for o in outputs]),
        sent_time=msg.sent_time,
        stop_token_ids=_optional([o.stop_token_id for o in outputs]),
        prompt_logprobs=_optional([o.prompt_logprobs for o in outputs]),
        replica=2,
        inbox="ipc:///x",
        prefix_cache=[3, 1],
    )
    assert encode(msg) == encode(by_hand)
    assert _frame(msg)[0] == WIRE_VERSION


@settings(max_examples=200, deadline=None)
@given(st.lists(text_output, max_size=6))
def test_text_outputs_round_trip_and_keep_their_wire_bytes(outputs):
    msg = pack_text_outputs(outputs, 1, None)
    assert unpack_text_outputs(decode(encode(msg))) == outputs
    by_hand = TextOutputs(
        rids=[o.rid for o in outputs],
        texts=[o.text for o in outputs],
        finish_reasons=[o.finish_reason for o in outputs],
        num_prompt_tokens=[o.num_prompt_tokens for o in outputs],
        num_output_tokens=[o.num_output_tokens for o in outputs],
        token_ids=[o.token_ids for o in outputs],
        logprobs=_optional([o.logprobs for o in outputs]),
        timings=_optional([o.timings for o in outputs]),
        stop_reasons=[o.stop_reason for o in outputs],
        sent_time=msg.sent_time,
        prompt_logprobs=_optional([o.prompt_logprobs for o in outputs]),
        replica=1,
    )
    assert encode(msg) == encode(by_hand)


def test_an_empty_batch_has_empty_columns_and_no_optional_ones():
    msg = pack_step_outputs(0, [], [])
    assert (msg.rids, msg.new_token_ids, msg.num_output_tokens) == ([], b"", b"")
    assert (msg.num_new_tokens, msg.finish_reasons) == (None, None)
    assert (msg.logprobs, msg.timings, msg.stop_token_ids, msg.prompt_logprobs) == (None,) * 4
    assert unpack_step_outputs(decode(encode(msg))) == []
    assert unpack_text_outputs(decode(encode(pack_text_outputs([])))) == []


@settings(max_examples=50, deadline=None)
@given(st.lists(step_output, min_size=1, max_size=4), st.data())
def test_a_column_of_another_length_is_refused(outputs, data):
    msg = pack_step_outputs(0, outputs, [])
    n = len(outputs)
    counts = [len(o.new_token_ids) // 4 for o in outputs]
    longer, error = data.draw(
        st.sampled_from(
            [
                ({"finish_reasons": [*(msg.finish_reasons or [None] * n), None]}, None),
                ({"num_output_tokens": msg.num_output_tokens + pack_ids([1])}, None),
                ({"num_prompt_tokens": msg.num_prompt_tokens[:-4]}, None),
                ({"num_new_tokens": pack_ids([*counts, 0])}, None),
                ({"new_token_ids": msg.new_token_ids + pack_ids([7])}, "bytes of new tokens"),
            ]
        )
    )
    [name] = longer
    with pytest.raises(WireError, match=error or f"{name} not as long as rids"):
        unpack_step_outputs(decode(encode(dataclasses.replace(msg, **longer))))


def test_a_codec_that_does_not_fit_its_record_or_message_is_refused_when_built():
    @dataclasses.dataclass
    class Rec:
        a: str
        b: int | None = None

    @dataclasses.dataclass(frozen=True)
    class Msg(Message):
        As: list[str]
        b: list[int | None] | None

    with pytest.raises(TypeError, match="Msg has no column a"):
        Columnar(Rec, Msg)
    with pytest.raises(TypeError, match="Rec has no field c"):
        Columnar(Rec, Msg, rename={"a": "As", "c": "Cs"})
    with pytest.raises(TypeError, match="key column"):
        Columnar(Rec, Msg, rename={"a": "As"}, optional=("a", "b"))
    codec = Columnar(Rec, Msg, rename={"a": "As"}, optional=("b",))
    assert codec.pack([Rec("x"), Rec("ü")]) == {"As": ["x", "ü"], "b": None}
    assert codec.pack([Rec("x"), Rec("y", 0)]) == {"As": ["x", "y"], "b": [None, 0]}
    assert codec.unpack(Msg(["x", "y"], None)) == [Rec("x"), Rec("y")]
