"""scheduler_worker.step_message: a step's outputs (OutputColumns) as one StepOutputs, its
columns sent as they are, read back by the detokenizer's own unpacking."""

from __future__ import annotations

from types import SimpleNamespace

from common.messages import decode, encode, unpack_ids, unpack_step_outputs
from scheduler_worker.sampling import TokenLogprobs
from scheduler_worker.step_message import step_message
from scheduler_worker.step_output import OutputColumns, RequestOutput


def _columns(rows: list) -> OutputColumns:
    """The step's columns of rows: a RequestOutput added, or a common row's fields
    (request id, token, logprobs, prompt, output and cached counts) appended as the
    resolve loop does."""
    columns = OutputColumns()
    for row in rows:
        if type(row) is RequestOutput:
            columns.add(row)
            continue
        rid, token, lps, num_prompt, num_output, cached = row
        if lps is not None:  # by its row, as the resolve loop keeps them
            columns.logprobs[len(columns.request_ids)] = lps
        columns.request_ids.append(rid)
        columns.token_ids.append(token)
        columns.num_prompt.append(num_prompt)
        columns.num_output.append(num_output)
        columns.num_cached.append(cached)
    return columns


def _by_row(col: list) -> dict[int, list]:
    """A full logprobs column (None: a row without) as OutputColumns keeps it, by row."""
    return {i: v for i, v in enumerate(col) if v is not None}


def _record(rid: str):
    return SimpleNamespace(tokenized_time=5.0, detok_settings=(rid, [], True, False, 0, 0))


def test_columns_round_trip_through_the_wire():
    lp = TokenLogprobs(9, -0.5, [9, 4], [-0.5, -1.5])
    outs = _columns(
        [  # a common row: its fields appended to the columns (the resolve loop's)
            ("a", 7, None, 3, 1, 0),
            RequestOutput("b", [8, 9], "stop", [lp, lp], 4, 6, 2, 9, {"received": 1.0}),
            RequestOutput("c", [], "abort", None, 2, 0, 0),
            ("d", 123456, None, 1, 2, 0),
        ]
    )
    records = {rid: _record(rid) for rid in "abcd"}
    unannounced = {"a", "d", "z"}
    msg = step_message(3, outs, records, unannounced, replica=1, inbox="ipc://x")
    got = unpack_step_outputs(decode(encode(msg)))
    assert [g.rid for g in got] == ["a", "b", "c", "d"]
    assert [unpack_ids(g.new_token_ids) for g in got] == [[7], [8, 9], [], [123456]]
    assert [g.finish_reason for g in got] == [None, "stop", "abort", None]
    assert got[1].stop_token_id == 9 and got[0].stop_token_id is None
    assert got[1].logprobs == [[-0.5, [[9, -0.5], [4, -1.5]]]] * 2 and got[0].logprobs is None
    assert got[1].timings is not None and got[1].timings["tokenized_time"] == 5.0
    assert [n[0] for n in msg.new_requests] == ["a", "d"] and unannounced == {"z"}
    assert set(records) == {"a", "d"}  # the finished ones' records go


def test_a_step_of_single_tokens_packs_them_at_once():
    outs = _columns([(f"r{i}", i * 1000, None, 5, 9, 0) for i in range(50)])
    msg = step_message(0, outs, {}, set())
    assert unpack_ids(msg.new_token_ids) == [i * 1000 for i in range(50)]
    assert msg.num_new_tokens is None  # one a row
    assert msg.finish_reasons is None  # none finished
    assert msg.logprobs is None and msg.timings is None and msg.stop_token_ids is None
    got = unpack_step_outputs(decode(encode(msg)))
    assert [unpack_ids(g.new_token_ids) for g in got] == [[i * 1000] for i in range(50)]
    assert [g.finish_reason for g in got] == [None] * 50


def test_columns_equal_each_outputs_fields_read_by_name():
    """The message's columns are each row's field, read by name a row (the slow path),
    prompt logprobs and counts included; none for no rows."""
    lp = TokenLogprobs(3, -0.25, [3], [-0.25])
    prompt = [None, [5, -1.0, []]]
    outs = [
        RequestOutput(f"r{i}", [i], None, [lp] if i % 3 == 0 else None, 10 + i, 20 + i, i)
        for i in range(7)
    ]
    outs[4] = outs[4]._replace(prompt_logprobs=prompt)
    msg = step_message(1, OutputColumns.of(outs), {}, set())
    assert msg.rids == [o.request_id for o in outs]
    assert unpack_ids(msg.num_prompt_tokens) == [o.num_prompt_tokens for o in outs]
    assert unpack_ids(msg.num_output_tokens) == [o.num_output_tokens for o in outs]
    assert msg.finish_reasons is None  # none finished
    assert msg.prompt_logprobs == [o.prompt_logprobs for o in outs]
    assert msg.logprobs is None and msg.token_logprobs is not None  # one token a row: packed
    got = unpack_step_outputs(decode(encode(msg)))
    assert [g.logprobs for g in got] == [
        [[-0.25, [[3, -0.25]]]] if o.logprobs else None for o in outs
    ]
    empty = step_message(2, OutputColumns(), {}, set())
    assert empty.rids == [] and empty.new_token_ids == b"" and empty.logprobs is None


def test_the_logprobs_column_equals_each_rows_own_build():
    """The column built in C passes (one token's logprobs a row) equals _wire_logprobs a
    row, with rows of several tokens (accepted drafts), none, or an empty list beside."""
    import random

    from common.messages.scheduler_detok import unpack_token_logprobs
    from scheduler_worker.step_message import _logprobs_column, _logprobs_columns, _wire_logprobs

    rng = random.Random(4)

    def lp() -> TokenLogprobs:
        k = rng.choice((0, 1, 5, 20))
        ids = [rng.randrange(1000) for _ in range(k)]
        return TokenLogprobs(rng.randrange(1000), -rng.random(), ids, [-rng.random()] * k)

    shapes = (None, None, None, 1, 1, 2, 0)
    for _ in range(300):
        n = rng.randint(1, 40)
        col = [None if s is None else [lp() for _ in range(s)] for s in rng.choices(shapes, k=n)]
        want = [None if v is None else _wire_logprobs(v) for v in col]
        assert _logprobs_column(_by_row(col), n) == (None if col.count(None) == n else want)
        # the message's fields: packed where each row has one token's, read back the same
        fields = _logprobs_columns(_by_row(col), n)
        packed = fields.get("token_logprobs")
        assert (packed is not None) == ({len(v) for v in col if v is not None} == {1})
        got = fields["logprobs"] if packed is None else unpack_token_logprobs(packed, n)
        assert got == (None if col.count(None) == n else want)
    # a value the packing cannot hold (an id past int32): the lists
    big = [[TokenLogprobs(1, -0.5, [2**40], [-0.5])], None]
    got = _logprobs_columns(_by_row(big), 2)
    assert got == {"logprobs": [[[-0.5, [[2**40, -0.5]]]], None]}


def test_kept_logprobs_rows_give_the_message_of_their_lists():
    """Rows carrying RowLogprobs (result(kept=True)) give the same message fields as the
    same rows with their TokenLogprobs: from one step's block packed from its arrays; two
    blocks, a TokenLogprobs beside them, or rows of several tokens, by the lists."""
    import random

    import torch

    from common.messages.scheduler_detok import unpack_token_logprobs
    from scheduler_worker.sampling import DeviceSample
    from scheduler_worker.step_logprobs import token_logprobs
    from scheduler_worker.step_message import _logprobs_columns

    rng = random.Random(5)

    def block(n: int) -> list:
        rows = sorted(rng.sample(range(n), rng.randint(1, n)))
        num_top = [rng.choice((0, 5, 20)) for _ in rows]
        s = DeviceSample(torch.randint(0, 1000, (n,)), rows, num_top, -torch.rand(len(rows)))
        if max(num_top):
            s.top_logprobs = -torch.rand(len(rows), max(num_top))
            s.top_ids = torch.randint(0, 1000, (len(rows), max(num_top)))
        return s.result(kept=True).logprobs

    for case in range(200):
        n = rng.randint(1, 30)
        kept = block(n)
        if case % 4 == 1:  # a second step's block in the same message
            kept = [a if a is not None else b for a, b in zip(kept, block(n))]
        col = [None if lp is None else [lp] for lp in kept]
        if case % 4 == 2:  # a row the engine resolved apart, with its lists
            col[rng.randrange(n)] = [TokenLogprobs(7, -0.25, [7], [-0.25])]
        if case % 4 == 3:  # an accepted draft's row: several tokens
            col[rng.randrange(n)] = [TokenLogprobs(7, -0.25, [7], [-0.25])] * 2
        lists = [None if v is None else list(map(token_logprobs, v)) for v in col]
        got, want = _logprobs_columns(_by_row(col), n), _logprobs_columns(_by_row(lists), n)
        assert got.keys() == want.keys()
        if "token_logprobs" in got:
            assert got["token_logprobs"] == want["token_logprobs"]
            assert unpack_token_logprobs(got["token_logprobs"], n) == unpack_token_logprobs(
                want["token_logprobs"], n
            )
        else:
            assert got == want
        # step(): a common row's RowLogprobs become its TokenLogprobs
        named = _columns([("r", 1, v, 3, 1, 0) for v in col]).outputs()
        assert [o.logprobs for o in named] == lists
