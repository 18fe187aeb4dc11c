"""StaticDecodeInputs.fill's fast paths (the tables staged straight into the host buffer;
a step whose every row's token is in flight gathered in one op) give the static inputs the
general path gives: rows with and without placeholders, padded to larger buckets."""

from __future__ import annotations

import random

import numpy as np
import torch

from scheduler_worker.backends.base import DecodeRows
from scheduler_worker.backends.graphs import StaticDecodeInputs
from scheduler_worker.model_runner import SeqInput

BS, SCRATCH = 4, 99


class _General(StaticDecodeInputs):
    """The reference: every step through take_placeholders."""

    def put_tokens(self, ids, pos, slots, prev, prev_tokens, leading_prev=0):
        super().put_tokens(ids, pos, slots, prev, prev_tokens)


def _state(inputs: StaticDecodeInputs, b: int) -> list[torch.Tensor]:
    return [inputs.ids[:b], inputs.pos[:b], inputs.slots[:b], inputs.ctx[:b], inputs.tables[:b]]


def test_fill_equals_the_general_path():
    rng = random.Random(1)
    fast = StaticDecodeInputs(32, 8, torch.device("cpu"), SCRATCH, BS)
    ref = _General(32, 8, torch.device("cpu"), SCRATCH, BS)
    kinds = {"all": 0, "some": 0, "none": 0}
    for _ in range(200):
        n = rng.randint(1, 24)
        b = rng.choice((n, n, min(32, n + rng.randint(1, 8))))
        mode = rng.choice(("all", "all", "some", "none"))
        in_flight = torch.randint(0, 1000, (n + 3,))
        seqs = []
        for _ in range(n):
            pos = rng.randrange(0, 8 * BS)
            table = [rng.randrange(50) for _ in range(pos // BS + 1 + rng.randrange(2))]
            pending = mode == "all" or mode == "some" and rng.random() < 0.5
            prev = rng.randrange(n + 3) if pending else -1
            seqs.append(
                SeqInput([-1 if pending else rng.randrange(1000)], pos, table, prev_row=prev)
            )
        rows = DecodeRows.of(seqs, SCRATCH)
        num_prev = fast.fill(rows, b, in_flight)
        assert ref.fill(rows, b, in_flight) == num_prev
        kinds[mode] += num_prev == n
        for got, want in zip(_state(fast, b), _state(ref, b)):
            assert torch.equal(got, want)
        w = max(rows.positions) // BS + 1
        out = np.full((n, w), -7, dtype=np.int64)
        for got, want in zip(rows.staged(BS, w, out), rows.staged(BS, w)):
            assert np.array_equal(got, want)
    assert kinds["all"] > 50  # the gather's path ran, padded and not


def test_decode_rows_count_the_rows_whose_token_is_known():
    """decode_rows counts the rows whose token is known (no placeholder: a row with no token
    in flight) as it reads their tokens: the count fill would take from prev_rows.
    position_array converts a list put in the positions' place again."""
    from types import SimpleNamespace

    from scheduler_worker.backends.block_tables import BlockTables
    from scheduler_worker.step_inputs import decode_rows

    rng = random.Random(2)
    tables = BlockTables(8, SCRATCH, width=4)
    for _ in range(50):
        reqs = [
            SimpleNamespace(
                num_computed_tokens=rng.randrange(1, 12),
                num_pending=int(rng.random() < 0.7),
                flight_row=i,
                token_ids=list(range(100, 116)),
                slot=i,
            )
            for i in range(rng.randint(1, 8))
        ]
        rows = decode_rows(reqs, tables)  # type: ignore[arg-type]
        assert rows.known == rows.num_known() == sum(not r.num_pending for r in reqs)
        assert rows.known == rows.prev_rows.count(-1)
        known = [t for t, p in zip(rows.token_ids, rows.prev_rows) if p < 0]
        assert known == [100 + r.num_computed_tokens for r in reqs if not r.num_pending]
        assert rows.position_array().tolist() == [r.num_computed_tokens for r in reqs]
    rows.positions = [p + 1 for p in rows.positions]
    assert rows.position_array().tolist() == rows.positions
