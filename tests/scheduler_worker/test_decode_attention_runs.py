"""Runs of verify queries in the paged decode attention kernel: a drafted row's 1 + k
queries (consecutive positions of one sequence, its block table repeated: spec/
verify_rows.py) are attended together, each block read once for all of them. Each query
must equal, bit for bit, the same query attended alone, as a plain decode step runs it:
that is what makes a verify row exact (test_spec_verify_rows.py checks it through the
whole model)."""

from __future__ import annotations

import pytest
import torch

from scheduler_worker import kernels
from scheduler_worker.attention import _decode_attention
from tests.conftest import kernels_built
from tests.scheduler_worker.test_kernels import ISAS, _paged

pytestmark = pytest.mark.skipif(not kernels_built(), reason="the C++ kernels are not built here")
ops = torch.ops.zeroserve
DTYPES = {  # (query, cache)
    "f32": (torch.float32, torch.float32),
    "f32-f16cache": (torch.float32, torch.float16),
    "bf16": (torch.bfloat16, torch.bfloat16),
}


def _runs(spec: list[tuple[int, int]], bs: int, h: int, hkv: int, d: int, dtypes, seed: int):
    """Rows for sequences given as (context length of the first query, queries): the
    queries of one sequence share its table and take lengths L, L + 1, ... ."""
    qt, ct = dtypes
    q1, kc, vc, tables1 = _paged(
        len(spec), [n + m - 1 for n, m in spec], bs, h, hkv, d, torch.float32, seed
    )
    rows = [s for s, (_, m) in enumerate(spec) for _ in range(m)]
    lens = torch.tensor([n + i for n, m in spec for i in range(m)])
    g = torch.Generator().manual_seed(seed + 1)
    q = torch.randn(len(rows), h, d, generator=g).to(qt)
    return q, kc.to(ct), vc.to(ct), tables1[rows].contiguous(), lens


CASES = [  # (sequences as (length, queries), block size, heads, KV heads, head size, window)
    ([(40, 5)], 16, 9, 3, 64, 0),  # one stream's verify, k = 4 (SmolLM2's heads)
    ([(31, 3), (7, 1), (16, 5), (100, 2)], 16, 9, 3, 64, 0),  # verify rows among plain ones
    ([(200, 20)], 16, 4, 2, 128, 0),  # longer than a run (17 queries): split in two
    ([(1, 4), (33, 9)], 8, 8, 1, 128, 0),  # from the first position; a block boundary inside
    ([(60, 6), (10, 3)], 16, 4, 1, 256, 23),  # a window starting inside a block
    ([(5, 3), (9, 2)], 4, 3, 3, 6, 0),  # a head size without vector blocks
    # a prompt's queries at a long context: the run cut to fit its scratch (kRunScratch)
    ([(2000, 20)], 16, 32, 8, 128, 0),
] + [([(17, 5)] * 8, 16, 9, 3, 64, 0)]  # 8 streams: tasks of whole runs


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtypes", DTYPES.values(), ids=DTYPES)
@pytest.mark.parametrize("case", CASES, ids=range(len(CASES)))
def test_a_run_of_verify_queries_equals_each_query_alone(case, dtypes, isa):
    spec, bs, h, hkv, d, window = case
    q, kc, vc, tables, lens = _runs(spec, bs, h, hkv, d, dtypes, seed=bs + d + len(spec))
    i, scale = kernels.isa_index(isa), d**-0.5
    out = ops.paged_decode_attention(q, kc, vc, tables, lens, scale, i, window)
    for r in range(q.shape[0]):  # each query as a decode step of its own attends it
        alone = ops.paged_decode_attention(
            q[r : r + 1], kc, vc, tables[r : r + 1], lens[r : r + 1], scale, i, window
        )
        assert torch.equal(out[r], alone[0]), f"query {r}"
    pos = torch.arange(tables.shape[1] * bs)[None, :]  # and the kernel is right at all
    keep = (pos < lens[:, None]) & (pos >= lens[:, None] - window if window else True)
    mask = keep.view(q.shape[0], 1, 1, -1)
    ref = _decode_attention(q.float(), kc.float(), vc.float(), tables, mask, scale, "sdpa")
    tol = 1e-5 if q.dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out.float(), ref, rtol=tol, atol=tol)


def test_rows_that_only_look_like_a_run_read_their_own_tables():
    """Consecutive lengths over different blocks (two sequences): no block is shared, and
    each row reads its own table."""
    q, kc, vc, tables, lens = _runs([(20, 1), (21, 1)], 16, 4, 2, 64, DTYPES["f32"], 5)
    assert lens.tolist() == [20, 21] and not torch.equal(tables[0], tables[1])
    out = ops.paged_decode_attention(q, kc, vc, tables, lens, 0.125, 0, 0)
    for r in range(2):
        alone = ops.paged_decode_attention(
            q[r : r + 1], kc, vc, tables[r : r + 1], lens[r : r + 1], 0.125, 0, 0
        )
        assert torch.equal(out[r], alone[0])
