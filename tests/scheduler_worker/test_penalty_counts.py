"""Penalties from the counts kept per slot (penalty_counts.PenaltyCounts) give the logits
the per-row path gives, bit for bit: requests joining with outputs already made (resume,
fork), leaving, preempted and resumed in another slot, slots reused, rows skipping a step,
tokens in flight, verify chunks with drafts accepted and rejected; and so do the one ops
that apply them (penalties.penalty_op: the C++ kernels' on a CPU, the Triton kernel of a
GPU, here in Triton's interpreter where there is none)."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import pytest
import torch

from common.sampling_params import SamplingParams
from scheduler_worker import kernels
from scheduler_worker.backends import triton_penalties
from scheduler_worker.backends.base import PenalizeRows
from scheduler_worker.batch_params import BatchParamsCache
from scheduler_worker.logits_processors import SamplingRow
from scheduler_worker.penalties import COMMIT, CPU_PENALIZE, apply_penalties
from scheduler_worker.penalty_counts import PenaltyCounts
from scheduler_worker.sampling import Sampler

VOCAB, SLOTS = 42, 16  # 42: the C++ op's SSE2 loop and its tail


@dataclass
class Req:
    params: SamplingParams
    prompt: list[int]
    outs: list[int] = field(default_factory=list)
    slot: int = -1
    flying: int | None = None  # the value of its trailing placeholder, once resolved


def _params(rng: random.Random) -> SamplingParams:
    kind = rng.randrange(6)
    return SamplingParams(
        max_tokens=512,
        temperature=rng.choice((0.0, 0.7)),
        repetition_penalty=rng.choice((1.0, 1.3, 0.8)) if kind in (0, 1) else 1.0,
        presence_penalty=rng.choice((0.0, 0.5, -0.25)) if kind in (1, 2) else 0.0,
        frequency_penalty=rng.choice((0.0, 0.4)) if kind in (2, 3) else 0.0,
    )


def _tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(VOCAB + 3) for _ in range(n)]  # some past the logits' width


_CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA")


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=_CUDA)])
def test_kept_counts_give_the_per_row_logits_bit_for_bit(device: str):
    rng = random.Random(52)
    pool = PenaltyCounts()
    # the one ops, each with its pool, in place on a copy (the engine's step logits)
    ops = {"triton": PenalizeRows(triton_penalties.penalize_rows, device)}
    if device == "cpu" and kernels.load():
        ops["c++"] = CPU_PENALIZE
    pools = {name: PenaltyCounts() for name in ops}
    calls = dict.fromkeys(ops, 0)
    commits = dict.fromkeys(ops, 0)  # calls that kept the tokens in flight counted

    def counted(name: str, fn):
        def call(*args):
            calls[name] += 1
            commits[name] += bool(args[-1] & COMMIT)
            return fn(*args)

        return call

    ops = {name: PenalizeRows(counted(name, op.fn), op.device) for name, op in ops.items()}
    cache = BatchParamsCache()
    running: list[Req] = []
    waiting: list[Req] = []  # preempted: their outputs kept, no slot
    seen = {"joins": 0, "resumes": 0, "reused": 0, "drafts": 0, "flying": 0, "penalized": 0}
    used: set[int] = set()
    for step in range(400):
        for r in running:  # the last step's token in flight resolves
            if r.flying is not None:
                r.outs[-1], r.flying = r.flying, None
        if running and rng.random() < 0.15:  # a request finishes: its slot is free
            running.remove(rng.choice(running))
        if running and rng.random() < 0.1:  # preempted: back to waiting, outputs kept
            r = rng.choice(running)
            running.remove(r)
            r.slot = -1
            waiting.append(r)
        free = sorted(set(range(SLOTS)) - {r.slot for r in running})
        while free and rng.random() < 0.4:
            slot = free.pop(rng.randrange(len(free)))
            if waiting and rng.random() < 0.5:
                r = waiting.pop(rng.randrange(len(waiting)))
                seen["resumes"] += 1
            else:  # a new request (a fork or a prefix-cache hit may come with outputs)
                plen = rng.choice((1, 5, 60))
                r = Req(_params(rng), _tokens(rng, plen), _tokens(rng, rng.choice((0, 0, 7))))
                seen["joins"] += 1
            seen["reused"] += slot in used
            used.add(slot)
            r.slot = slot
            running.append(r)
        batch = [r for r in running if rng.random() < 0.85]  # some sit the step out
        prev = torch.randint(0, VOCAB, (32,), generator=torch.Generator().manual_seed(step))
        rows: list[SamplingRow] = []
        for r in batch:
            pending = -1
            if rng.random() < 0.5:  # its last token is the step in flight's
                pending = rng.randrange(32)
                r.outs.append(-1)
                r.flying = int(prev[pending])
                seen["flying"] += 1
            elif rng.random() < 0.7:
                r.outs.append(rng.randrange(VOCAB))
            if r.flying is None and rng.random() < 0.2:  # a verify chunk: drafts d[:j]
                d = _tokens(rng, rng.randint(1, 4))
                rows += [
                    SamplingRow(r.params, r.prompt, r.outs, -1, None, d[:j], r.slot)
                    for j in range(len(d) + 1)
                ]
                r.outs += d[: rng.randrange(len(d) + 1)]  # accepted; the rest rejected
                seen["drafts"] += 1
            else:
                rows.append(SamplingRow(r.params, r.prompt, r.outs, pending, None, (), r.slot))
        if not rows:
            continue
        logits = torch.randn(len(rows), VOCAB, generator=torch.Generator().manual_seed(~step))
        logits[logits < -1.8] = float("-inf")  # masked tokens (a grammar, min_tokens)
        logits[:, 3] = 0.0
        logits, prev = logits.to(device), prev.to(device)
        bp = cache.get([r.params for r in rows], [r.slot for r in rows])
        kept = apply_penalties(logits, rows, prev, bp.penalized, bp.values, pool)
        each = apply_penalties(logits, rows, prev, bp.penalized, bp.values)
        assert torch.equal(kept, each), f"step {step}"
        for name, op in ops.items():
            own = logits.clone()
            pen = (bp.penalized, bp.values, pools[name])
            out = apply_penalties(own, rows, prev, *pen, in_place=True, op=op)
            assert out is own and torch.equal(out, each), f"{name}, step {step}"
        seen["penalized"] += len(bp.penalized)
        assert pool.num_entries <= 2 * SLOTS
    assert pool.counts is not None and pool.counts.device.type == device
    assert min(seen.values()) > 10, seen
    assert seen["penalized"] > 800, seen
    assert min(calls.values()) > 150, calls  # the ops ran (a step with drafts: torch's)
    assert min(commits.values()) > 100, commits


@pytest.mark.skipif(not kernels.load(), reason="the C++ kernels are not built here")
def test_the_cpu_op_refuses_an_index_out_of_range():
    logits, counts = torch.zeros(2, 8), torch.zeros(1, 8)
    seen, one = torch.zeros(1, 8, dtype=torch.bool), torch.zeros(1, dtype=torch.long)
    nums = torch.tensor([[1.0, 0.5, 0.0]])
    with pytest.raises(RuntimeError, match="out of range"):  # entry 1 of a pool of 1
        CPU_PENALIZE.fn(logits, one, one + 1, counts, seen, one - 1, one, nums, 2)
    CPU_PENALIZE.fn(logits, one, one, counts, seen, one - 1, one, nums, 2)
    assert torch.equal(logits, torch.zeros(2, 8))  # no count: nothing changes


def test_a_batch_without_penalties_allocates_nothing():
    sampler = Sampler(VOCAB, [0])
    plain = SamplingParams(max_tokens=8, temperature=0.7)
    rows = [SamplingRow(plain, [1, 2], [3], -1, None, (), s) for s in range(8)]
    sampler.sample(torch.randn(8, VOCAB), rows).result()
    assert sampler.batch.counts.counts is None
    pen = SamplingParams(max_tokens=8, presence_penalty=2.0)
    rows[5] = SamplingRow(pen, [1, 2], [3, 3], -1, None, (), 5)  # slot 5 takes a penalty
    logits = torch.zeros(8, VOCAB)
    logits[5, 3] = 1.5  # its output token, beaten once its presence penalty applies
    got = sampler.sample(logits.clone(), rows).result().token_ids
    assert got[5] != 3
    assert sampler.batch.counts.num_entries == 1


def test_an_entry_follows_its_request_not_its_slot():
    """Slot 0 passes to a new request: its counts are the new request's alone; the old
    request's outputs resume in slot 1 and are counted there from the start."""
    pool = PenaltyCounts()
    freq = SamplingParams(max_tokens=8, frequency_penalty=1.0)
    a_outs, b_outs = [7, 7, 7], [9]
    a = SamplingRow(freq, [1], a_outs, -1, None, (), 0)
    logits = torch.zeros(1, VOCAB)
    assert apply_penalties(logits, [a], None, [0], None, pool)[0, 7] == -3.0
    a_outs.append(7)
    assert apply_penalties(logits, [a], None, [0], None, pool)[0, 7] == -4.0
    b = SamplingRow(freq, [1], b_outs, -1, None, (), 0)
    got = apply_penalties(logits, [b], None, [0], None, pool)[0]
    assert got[7] == 0.0 and got[9] == -1.0
    a.slot = 1
    assert apply_penalties(logits, [a], None, [0], None, pool)[0, 7] == -4.0


@pytest.mark.parametrize("name", ["c++", "triton"])
def test_a_token_in_flight_the_op_counts_is_counted_once(name: str):
    """The op keeps a row's token in flight in the pool (COMMIT): resolved at the next step
    it is not added again. Outputs cut below the count (a finished request's placeholder
    dropped: it samples no more, but an entry must not trust it) are counted again."""
    if name == "c++" and not kernels.load():
        pytest.skip("the C++ kernels are not built here")
    op = CPU_PENALIZE if name == "c++" else PenalizeRows(triton_penalties.penalize_rows)
    pool, freq = PenaltyCounts(), SamplingParams(max_tokens=8, frequency_penalty=1.0)
    bp, prompt, outs = BatchParamsCache().get([freq], [0]), [1], [7, -1]
    calls: list[int] = []

    def step(in_flight: int | None) -> torch.Tensor:
        pending, prev = (-1, None) if in_flight is None else (0, torch.tensor([in_flight]))
        row = SamplingRow(freq, prompt, outs, pending, None, (), 0)
        logits = torch.zeros(1, VOCAB)
        flags = PenalizeRows(lambda *a: calls.append(a[-1]) or op.fn(*a), op.device)
        apply_penalties(logits, [row], prev, [0], bp.values, pool, in_place=True, op=flags)
        return -logits[0]  # each token's count

    got = step(7)
    assert got[7] == 2.0 and pool.counted == [2] and calls[-1] & COMMIT
    assert pool.counts is not None and pool.counts[0, 7] == 2.0  # kept by the op
    outs[1] = 7  # resolved: counted already
    outs.append(-1)
    got = step(9)
    assert got[7] == 2.0 and got[9] == 1.0 and pool.counts[0, 9] == 1.0
    assert pool.counted == [3]
    outs[2] = 9
    got = step(None)  # nothing in flight: nothing to add
    assert got[7] == 2.0 and got[9] == 1.0 and pool.counted == [3]
    assert pool.counts[0].sum() == 3.0
    outs.append(-1)
    step(5)
    assert pool.counts[0, 5] == 1.0 and pool.counted == [4]
    del outs[3]  # its placeholder dropped: the entry counted again from the outputs
    got = step(None)
    assert got[5] == 0.0 and got[7] == 2.0 and got[9] == 1.0 and pool.counts[0, 5] == 0.0
    assert pool.counted == [3]
    outs.extend((-1, -1))  # two in flight (never while overlapped): not committed
    step(4)
    assert not calls[-1] & COMMIT and pool.counted == [3] and pool.counts[0, 4] == 0.0


def test_a_row_without_a_slot_takes_the_per_row_path():
    """One penalized row without a slot (-1): the step's penalties are counted row by row,
    the same logits; the slotted row's entry is still brought up to its outputs."""
    pool, freq = PenaltyCounts(), SamplingParams(max_tokens=8, frequency_penalty=1.0)
    bp = BatchParamsCache().get([freq, freq])
    rows = [
        SamplingRow(freq, [1], [7, 7], -1, None, (), 3),
        SamplingRow(freq, [1], [9], -1, None, (), -1),
    ]
    logits = torch.zeros(2, VOCAB)
    each = apply_penalties(logits, rows, None, [0, 1], bp.values)
    got = apply_penalties(logits, rows, None, [0, 1], bp.values, pool, op=CPU_PENALIZE)
    assert torch.equal(got, each) and got[0, 7] == -2.0 and got[1, 9] == -1.0
    assert pool.counted == [2] and pool.counts is not None and pool.counts[0, 7] == 2.0
    alone = apply_penalties(logits, rows[1:], None, [0], bp.values[1:], pool)
    assert alone[0, 9] == -1.0 and pool.counted == [2]  # no row with a slot: none taken
