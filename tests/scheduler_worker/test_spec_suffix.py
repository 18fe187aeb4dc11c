"""Suffix drafts (scheduler_worker/spec/suffix.py): the longest match and the votes of its
occurrences, the confidence cut, the store shared across requests and its memory bound,
and greedy outputs with suffix drafts equal to those without, token for token."""

from __future__ import annotations

import random

import pytest

from common.cli import parse_config
from common.sampling_params import SamplingParams
from scheduler_worker.spec import make_drafter
from scheduler_worker.spec.suffix import PER_KEY, PROMPT_TAIL, SIZES, SuffixDrafter, SuffixIndex
from tests.scheduler_worker.test_spec_ngram import _repetitive, _run


def test_longest_match_then_the_majority_of_its_occurrences():
    d = SuffixDrafter()
    # [1, 2] is followed by 3 three times, by 4 once (the latest): the majority drafts
    tokens = [1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 4, 0, 1, 2]
    assert d.propose(tokens, None, 4)[0][:1] == [3]
    # a deeper match outvotes the majority of a shallower one: [8, 1, 2] occurred once
    tokens = [5, 1, 2, 3, 6, 1, 2, 3, 7, 1, 2, 3, 8, 1, 2, 9, 4, 8, 1, 2]
    assert d.propose(tokens, None, 3)[0] == [9, 4, 8]
    # a tie: the latest occurrence's continuation (as prompt lookup)
    assert d.propose([1, 2, 3, 9, 9, 1, 2, 3, 7, 8, 5, 1, 2, 3], None, 3)[0] == [7, 8, 5]
    assert d.propose([4, 5, 6], None, 3)[0] == []  # nothing repeats
    assert d.propose([5, 6, 5], None, 3)[0] == []  # 1-token matches draft nothing


def test_draft_length_follows_the_match_and_the_confidence():
    d = SuffixDrafter()
    # the match's length bounds the draft (factor 1): 3 tokens matched, at most 3 drafted
    assert d.propose([1, 2, 3, 4, 5, 6, 7, 1, 2, 3], None, 8)[0] == [4, 5, 6]
    long = list(range(10, 30))
    assert d.propose([*long, 0, *long[:8]], None, 8)[0] == long[8:16]
    # a repeat past the context's end reads the draft's own tokens
    assert d.propose([9, 9, 9, 9], None, 3)[0] == [9, 9, 9]
    # the deepest matches, [0, 1, 2] four times, go on four ways: each 1/4 of the votes
    tokens = [1, 2, 10, 0, 1, 2, 11, 0, 1, 2, 12, 0, 1, 2, 13, 0, 1, 2, 14, 0, 1, 2]
    assert d.propose(tokens, None, 2)[0] == [14, 0]  # 0.25 >= min_prob 0.1, then 1/1
    assert SuffixDrafter(min_prob=0.3).propose(tokens, None, 2)[0] == []
    # [7, 8] goes on with 1, 1, 5 (2/3 of the votes), then [7, 8, 1] with 2 or 3 (a tie:
    # the latest's), so the draft is right with probability 2/3 * 1/2 = 1/3
    tokens = [7, 8, 1, 2, 90, 7, 8, 1, 3, 91, 7, 8, 5, 2, 92, 7, 8]
    assert d.propose(tokens, None, 2)[0] == [1, 3]
    assert SuffixDrafter(min_prob=0.5).propose(tokens, None, 2)[0] == [1]
    with pytest.raises(ValueError, match="min_prob"):
        SuffixDrafter(min_prob=0.0)


def test_own_index_grows_with_the_tokens():
    d = SuffixDrafter()
    tokens = [1, 2, 3, 4]
    drafts, state = d.propose(tokens, None, 3)
    assert drafts == []
    rng = random.Random(0)
    for _ in range(300):  # incremental state == a fresh index, at every length
        tokens.append(rng.randrange(6))
        drafts, state = d.propose(tokens, state, 4)
        assert drafts == d.propose(tokens, None, 4)[0]
    assert isinstance(state, SuffixIndex) and state.num_tokens == len(tokens)


def test_drafts_from_other_requests_outputs():
    d = SuffixDrafter()
    prompt = [900 + i for i in range(30)]
    output = [40, 41, 42, 43, 44, 45, 46, 47, 48, 49]
    other = [700, 701, 702, 41, 42, 43]  # another request's context ends like the output
    assert d.propose(other, None, 4)[0] == []
    d.observe(prompt, output)
    assert d.propose(other, None, 4)[0] == [44, 45, 46]  # 3 matched: 3 drafted
    # the prompt's last tokens are stored before the output: a request whose prompt ends
    # as that one's (a chat template's header) drafts the output's start
    assert d.propose([1, 2, *prompt[-5:]], None, 4)[0] == output[:4]
    assert d.propose([1, 2, *prompt[-PROMPT_TAIL - 3 : -PROMPT_TAIL]], None, 4)[0] == []
    # own tokens and the store: the draft with more expected accepted tokens
    own = [41, 42, 43, 60, 61, 62, 0, 41, 42, 43]
    assert d.propose(own, None, 3)[0] == [60, 61, 62]  # both sure: the own draft first
    d.observe([], [41, 42, 43, 44, 45, 46, 47, 48, 49])  # the store: 2 of 2 agree
    assert d.propose(own, None, 4)[0] == [60, 61, 62]
    # an abort leaves placeholders (-1) at the end: they are no tokens
    d2 = SuffixDrafter()
    d2.observe([], [5, 6, 7, 8, -1, -1])
    assert d2.store.num_tokens == 4 and d2.store.segments == [[5, 6, 7, 8]]
    d2.observe([], [-1])
    assert d2.store.num_tokens == 4
    assert SuffixDrafter(store_tokens=0).observe([1], [2, 3]) is None


def _reference(store: SuffixIndex) -> SuffixIndex:
    """A fresh index of the store's segments, at the same positions."""
    ref = SuffixIndex()
    ref.next_base = store.bases[0] if store.bases else store.next_base
    for seg in store.segments:
        ref.open()
        ref.extend(seg)
    return ref


def test_store_stays_within_its_budget_and_evicts_the_oldest():
    budget = 1000
    d = SuffixDrafter(store_tokens=budget)
    rng = random.Random(1)
    first = [1000 + i for i in range(40)]
    d.observe([], first)
    assert d.propose(first[:10], None, 4)[0] == first[10:14]
    for i in range(120):
        # few token ids: short contexts recur, their lists reach PER_KEY
        out = [rng.randrange(10) for _ in range(rng.randrange(5, 60))]
        d.observe([rng.randrange(10) for _ in range(30)], out)
        store = d.store
        assert store.num_tokens == sum(map(len, store.segments)) <= budget
        assert store.num_entries <= len(SIZES) * store.num_tokens
        if i % 10 == 0 and store.segments:
            ref = _reference(store)  # nothing of an evicted segment is left
            assert store.index == ref.index and store.bases == ref.bases
            lists = [v for idx in store.index.values() for v in idx.values()]
            assert all(len(v) <= PER_KEY for v in lists if isinstance(v, list))
    assert d.propose(first[:10], None, 4)[0] == []  # evicted long ago
    assert max(len(v) for v in d.store.index[2].values() if isinstance(v, list)) == PER_KEY
    # an output longer than the whole budget keeps its last tokens
    d.observe([], list(range(5000, 5000 + 3 * budget)))
    assert d.store.segments == [list(range(5000 + 2 * budget, 5000 + 3 * budget))]
    assert d.store.num_entries <= len(SIZES) * budget


def test_flag_and_factory():
    cfg = parse_config("t", ["--speculative-method", "suffix"])
    assert cfg.engine.scheduler.speculative_method == "suffix"
    assert isinstance(make_drafter("suffix"), SuffixDrafter)


@pytest.fixture(scope="module")
def llama(tiny_model_dirs):
    return tiny_model_dirs["llama"]


@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    "setup",
    [dict(), dict(num_blocks=20, max_num_seqs=8), dict(max_num_batched_tokens=9)],
    ids=["default", "preemption", "small-budget"],
)
def test_greedy_equal_with_suffix_drafts(llama, setup):
    prompts = _repetitive(10, seed=1)
    params = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    want, _ = _run(llama, prompts, params, False, **setup)
    drafter = SuffixDrafter()
    got, counters = _run(llama, prompts, params, drafter, **setup)
    assert got == want
    assert counters.accepted_tokens > 0
    assert counters.draft_tokens > counters.accepted_tokens
    assert counters.generation_tokens == sum(map(len, got))
    # every finished request fed the store (its output after its prompt's last tokens)
    assert len(drafter.store.segments) == len(prompts)
    assert sorted(map(len, drafter.store.segments)) == sorted(
        min(PROMPT_TAIL, len(p)) + len(o) for p, o in zip(prompts, got)
    )


@pytest.mark.timeout(600)
def test_later_requests_draft_from_earlier_outputs(llama):
    """The same prompts a second time, one after another in one engine: the store holds
    the first outputs, so far more drafts are accepted, and the outputs stay the same."""
    prompts = _repetitive(4, seed=6)
    params = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    want, _ = _run(llama, prompts, params, False)
    drafter = SuffixDrafter()
    first, c1 = _run(llama, prompts, params, drafter)
    accepted = c1.accepted_tokens
    again, c2 = _run(llama, prompts, params, drafter)
    assert first == again == want
    # k = 4: at most 32 of a 40-token output are accepted drafts (8 steps of 1 + 4)
    assert c2.accepted_tokens >= 0.9 * 32 * len(prompts) > accepted
