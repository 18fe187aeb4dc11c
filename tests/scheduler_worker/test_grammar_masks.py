"""The grammar masks' pieces on their own (scheduler_worker/structured.py,
logits_processors.apply_token_masks, backends/triton_masks.py): a step's masks against the
library's, the constrained rows found in a batch, and the bits applied to the logits on
every path; test_structured.py has them through the engine."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from common.sampling_params import SamplingParams
from scheduler_worker import kernels
from scheduler_worker.backends import triton_masks
from scheduler_worker.backends.base import MaskRows
from scheduler_worker.engine import LLMEngine
from scheduler_worker.logits_processors import apply_token_masks
from scheduler_worker.request import Request, RequestStatus
from scheduler_worker.sampling import SamplingRow
from tests.scheduler_worker.test_structured import SPECS, make_engine, pack


def unpack(words: torch.Tensor, vocab: int) -> torch.Tensor:
    """int32 [rows, W] packed bitmask -> bool [rows, vocab], token by token (the reference)."""
    return torch.tensor(
        [[(int(row[t // 32]) >> (t % 32)) & 1 == 1 for t in range(vocab)] for row in words]
    )


@pytest.fixture(scope="module")
def engine(tiny_llama_dir) -> LLMEngine:
    return make_engine(tiny_llama_dir)


def test_a_step_s_masks_are_the_library_s_with_each_stop_id_by_acceptance(engine, monkeypatch):
    """_masks (the step's rows filled in one call, their EOS bits set together) gives each
    row the library's own mask, with every id the engine stops on allowed exactly where
    that row's matcher accepts, a word's last bit (31) too, and nothing else changed."""
    g = engine.grammars
    monkeypatch.setattr(g, "eos_token_ids", [2, 63, 100])
    states = [(SPECS[1], "123-ab"), (SPECS[1], "12"), (SPECS[2], "red"), (SPECS[2], "")]
    states += [(SPECS[3], ""), (SPECS[1], "123-abcd")]
    matchers = []
    for spec, text in states:
        m = g.compiled(spec)
        assert all(m.consume_token(t) for t in g.tokenizer.tokenize_str(text))
        matchers.append(m)
    got = g._masks(list(zip(range(3, 3 + len(matchers)), matchers)))
    assert list(got) == list(range(3, 3 + len(matchers)))
    accepting = [m.is_accepting() for m in matchers]
    assert True in accepting and False in accepting
    for m, a, mask in zip(matchers, accepting, got.values()):
        want = np.frombuffer(bytearray(m.compute_bitmask()), dtype=np.uint32).copy()
        for t in g.eos_token_ids:
            bit = np.uint32(1 << (t & 31))
            want[t >> 5] = want[t >> 5] | bit if a else want[t >> 5] & ~bit
        assert np.array_equal(mask.numpy().view(np.uint32), want[: mask.shape[0]])


def test_constrained_rows_are_found_where_the_index_of_ids_finds_them(engine):
    """start()'s rows of the constrained requests, found at their row of the step before
    where the batch kept them there, equal those an index of every row's id finds, over
    random batches: rows kept, moved, gone, joined; a stale or unset flight_row; queued
    requests; and a row whose flight_row names another request's row."""
    g = engine.grammars
    rng = random.Random(5)
    reqs = [
        Request(f"q{i}", [1, 2], SamplingParams(structured=SPECS[2] if i % 3 else None))
        for i in range(40)
    ]
    for r in reqs:
        g.add(r)
        r.status = RequestStatus.RUNNING
    constrained = {r.request_id for r in reqs if r.params.structured is not None}
    rows = rng.sample(reqs, 24)
    try:
        for step in range(300):
            if step % 4:  # most steps: the batch kept, a row or two gone or joined
                rows = [r for r in rows if rng.random() > 0.05]
                rows += rng.sample([r for r in reqs if r not in rows], rng.randrange(3))
            else:
                rows = rng.sample(reqs, rng.randrange(1, 40))
            for r in reqs:
                r.status = rng.choice([RequestStatus.RUNNING] * 5 + [RequestStatus.WAITING])
            for r in rows:
                r.status = RequestStatus.RUNNING
            where = {r.request_id: i for i, r in enumerate(rows)}
            want = sorted((where[rid], g.matchers[rid]) for rid in constrained if rid in where)
            got = g._rows_of(rows)
            assert [(i, id(m)) for i, m in got] == [(i, id(m)) for i, m in want]
            for i, r in enumerate(rows):  # the rows' flight_row, mostly current
                r.flight_row = i if rng.random() > 0.1 else rng.randrange(-1, 40)
    finally:
        for r in reqs:
            g.drop(r.request_id)


def test_token_masks_follow_the_bit_order():
    """bit j of word w is token 32w + j, on every path (the C++ op on each ISA this CPU
    has, and torch's for other dtypes or without the kernels); tokens past the words' 32 W
    are forbidden, and words past the logits' width ignored; rows without a bitmask are
    untouched. A GPU's Triton launch gives the same, float32 and bfloat16."""
    gen = torch.Generator().manual_seed(3)
    words = torch.randint(-(2**31), 2**31 - 1, (3, 40), dtype=torch.int32, generator=gen)
    words[:, ::3], words[:, 1::5] = 0, -1  # whole words forbidden / allowed, as grammars have
    sp = SamplingParams()
    for vocab in (40 * 32 - 7, 40 * 32 + 9, 5 * 32 + 3):
        logits = torch.randn(4, vocab, generator=gen)
        rows = [SamplingRow(sp, [1], [], token_bitmask=w) for w in words] + [
            SamplingRow(sp, [1], [])
        ]
        want = logits.clone()
        allowed = unpack(words, min(vocab, 40 * 32))
        for r in range(3):
            want[r, : allowed.shape[1]][~allowed[r]] = float("-inf")
            want[r, allowed.shape[1] :] = float("-inf")
        isas = [None]
        if kernels.load():
            isas += [
                kernels.isa_index(n)
                for n in kernels.ISAS[: kernels.isa_index(kernels.best_isa()) + 1]
            ]
        for isa in isas:
            assert torch.equal(apply_token_masks(logits, rows, isa), want), (vocab, isa)
        got = apply_token_masks(logits.bfloat16(), rows, isas[-1])  # torch's path
        assert torch.equal(got.isinf(), want.isinf())
        # a GPU's one launch (backends/triton_masks.py; interpreted here, on the CPU)
        op = MaskRows(triton_masks.mask_rows, "cpu")
        got32 = apply_token_masks(logits, rows, None, op=op)
        got16 = apply_token_masks(logits.bfloat16(), rows, None, op=op)  # both launched first:
        assert torch.equal(got32, want), vocab  # compile_sm90.py compiles them both
        assert torch.equal(got16, want.bfloat16()), vocab
        assert torch.equal(pack(unpack(words[:1], 40 * 32)[0]), words[0])  # the helpers agree
