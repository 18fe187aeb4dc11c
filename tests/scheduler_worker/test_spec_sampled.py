"""Speculative decoding for rows that sample (scheduler_worker/spec/sampled.py): a seeded
row's tokens and logprobs with drafts equal those without, whatever its sampling options
(temperature, top-k/p, min-p, penalties, min_tokens, logit_bias, logprobs); unseeded rows
keep the target distribution (a chi-square test on the tokens of verified positions).
Every proposed draft is verified here (policy "always"; the adaptive switch: test_spec_policy.py)."""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch

from common.sampling_params import SamplingParams
from tests.scheduler_worker.test_engine import make_engine
from tests.scheduler_worker.test_spec_ngram import OracleDrafter, _repetitive

SAMPLED = {
    "temp-top-p": SamplingParams(max_tokens=30, temperature=0.7, top_p=0.9, seed=11),
    "top-k-min-p-logprobs": SamplingParams(
        max_tokens=30, temperature=1.0, top_k=20, min_p=0.05, seed=5, logprobs=2
    ),
    "penalties": SamplingParams(
        max_tokens=30,
        temperature=0.8,
        seed=3,
        presence_penalty=0.4,
        frequency_penalty=0.2,
        repetition_penalty=1.3,
    ),
    # the EOS (2) made likely: min_tokens holds it off, then it stops rows mid-run
    "min-tokens-bias": SamplingParams(
        max_tokens=30, temperature=0.9, seed=8, min_tokens=12, logit_bias={2: 10.0, 7: 3.0}
    ),
    "greedy-logprobs": SamplingParams(max_tokens=30, temperature=0.0, logprobs=3),
}


def _collect(engine, prompts, params, every: int = 2):
    """run_staggered with the logprobs: per prompt, (tokens, [(token, logprob, top ids)])."""
    outs: dict[str, tuple[list, list]] = {}
    pending = list(enumerate(prompts))
    step = 0
    while pending or engine.has_unfinished():
        if pending and step % every == 0:
            i, p = pending.pop(0)
            engine.add_request(f"r{i}", p, params)
            outs[f"r{i}"] = ([], [])
        for out in engine.step():
            tokens, lps = outs[out.request_id]
            tokens.extend(out.new_token_ids)
            if out.logprobs is not None:
                assert len(out.logprobs) == len(out.new_token_ids)
                lps.extend((x.token_id, x.logprob, x.top_ids) for x in out.logprobs)
        step += 1
    engine.block_manager.check_integrity()
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
    return [outs[f"r{i}"] for i in range(len(prompts))]


def _assert_same(got, want, with_logprobs: bool) -> None:
    for i, ((tokens, lps), (want_tokens, want_lps)) in enumerate(zip(got, want, strict=True)):
        assert tokens == want_tokens, f"prompt {i}"
        assert bool(lps) == with_logprobs and len(lps) == (len(tokens) if lps else 0)
        for (t, lp, top), (wt, wlp, wtop) in zip(lps, want_lps):
            assert t == wt and top == wtop and lp == pytest.approx(wlp, abs=1e-4)


@pytest.fixture(scope="module")
def tiny(tiny_model_dirs):
    return tiny_model_dirs["qwen2"]  # a 512-token vocabulary: sampling is cheap


@pytest.mark.timeout(900)
@pytest.mark.parametrize("name", sorted(SAMPLED))
@pytest.mark.parametrize("wrong", [False, True], ids=["right", "some-wrong"])
def test_seeded_sampled_equal_with_drafts(tiny, name, wrong):
    """Drafts from an oracle that knows the seeded output (`wrong`: every third draft off
    by one, so that some are refused): the same tokens, logprobs and stops as without."""
    params = SAMPLED[name]
    prompts = _repetitive(6, seed=7)
    want = _collect(make_engine(tiny, speculative_method="none"), prompts, params)
    engine = make_engine(
        tiny, speculative_method="ngram", num_speculative_tokens=4, speculative_policy="always"
    )
    engine.scheduler.drafter = OracleDrafter(prompts, [t for t, _ in want], wrong)
    got = _collect(engine, prompts, params)
    _assert_same(got, want, params.logprobs is not None)
    c = engine.counters
    assert c.accepted_tokens > 20  # the runs were verified...
    if wrong:
        assert c.draft_tokens > c.accepted_tokens  # ...and some refused
    assert c.generation_tokens == sum(len(t) for t, _ in got)
    if name == "min-tokens-bias":  # the EOS stops rows right after min_tokens
        assert all(12 <= len(t) < 30 for t, _ in got)


@pytest.mark.timeout(600)
def test_seeded_sampled_equal_with_preemption(tiny):
    """A KV pool that preempts: drafts' blocks and the recomputed prompts stay exact."""
    params = SAMPLED["temp-top-p"]
    prompts = _repetitive(8, seed=9)
    setup = dict(num_blocks=24, max_num_seqs=8)
    want = _collect(make_engine(tiny, speculative_method="none", **setup), prompts, params)
    engine = make_engine(
        tiny,
        speculative_method="ngram",
        num_speculative_tokens=4,
        speculative_policy="always",
        **setup,
    )
    engine.scheduler.drafter = OracleDrafter(prompts, [t for t, _ in want], wrong=True)
    got = _collect(engine, prompts, params)
    _assert_same(got, want, False)
    assert engine.counters.accepted_tokens > 20
    assert engine.scheduler.num_preemptions > 0


class TableDrafter:
    """Drafts a fixed continuation for each possible first output token."""

    def __init__(self, prompt_len: int, table: dict[int, list[int]]) -> None:
        self.prompt_len, self.table = prompt_len, table

    def observe(self, prompt_token_ids, output_token_ids):
        pass  # learns nothing across requests

    def propose(self, token_ids, state, k):
        if len(token_ids) != self.prompt_len + 1:
            return [], state
        return self.table.get(token_ids[-1], [])[:k], state


def _chi_square(a: Counter, b: Counter) -> tuple[float, int, float]:
    """Two samples of equal size, the same distribution? (statistic, degrees of freedom,
    p-value); cells with fewer than 10 draws in both together are pooled."""
    cells = sorted(set(a) | set(b))
    big = [c for c in cells if a[c] + b[c] >= 10]
    rest = (sum(a[c] for c in cells if c not in big), sum(b[c] for c in cells if c not in big))
    pairs = [(a[c], b[c]) for c in big] + ([rest] if sum(rest) >= 10 else [])
    stat = sum((x - y) ** 2 / (x + y) for x, y in pairs)
    df = len(pairs) - 1
    p = torch.special.gammaincc(torch.tensor(df / 2.0), torch.tensor(stat / 2.0)).item()
    return stat, df, p


@pytest.mark.timeout(900)
def test_unseeded_distribution_kept_chi_square(tiny_model_dirs):
    """20,000 unseeded requests (the engine's generator, torch seed fixed) with and without
    drafts: the joint frequencies of their 4 output tokens agree (chi-square); the 2nd and
    3rd are verified drafts' positions, with both acceptances and rejections."""
    model = tiny_model_dirs["qwen2"]
    prompt, n = [5, 17, 99, 3, 250, 41], 20_000
    params = SamplingParams(max_tokens=4, temperature=0.6, top_k=4, ignore_eos=True)
    setup = dict(max_num_seqs=256, max_num_batched_tokens=2048)
    greedy = make_engine(model, speculative_method="none", **setup)
    # drafts: after each likely first token, the greedy continuation (often but not
    # always what the row samples)
    first = Counter(t[0] for t in greedy.generate([prompt] * 200, params))
    table = {
        t: greedy.generate([prompt + [t]], SamplingParams(max_tokens=2, temperature=0.0))[0]
        for t in first
    }
    samples = {}
    for spec in (False, True):
        engine = make_engine(
            model,
            **setup,
            speculative_method="ngram",
            num_speculative_tokens=2,
            speculative_policy="always",
        )
        engine.scheduler.drafter = TableDrafter(len(prompt), table) if spec else None
        torch.manual_seed(1)
        samples[spec] = Counter(map(tuple, engine.generate([prompt] * n, params)))
        if spec:
            c = engine.counters
            rate = c.accepted_tokens / c.draft_tokens
            assert c.draft_tokens > 0.9 * n * 2 and 0.1 < rate < 0.9, (c.draft_tokens, rate)
    assert sum(samples[True].values()) == sum(samples[False].values()) == n
    stat, df, p = _chi_square(samples[True], samples[False])
    assert df >= 20 and p > 1e-3, (stat, df, p)
    # each position's marginal too (the next-token frequencies at a verified position)
    for pos in range(4):
        marg = [Counter(t[pos] for t in s.elements()) for s in (samples[True], samples[False])]
        stat, df, p = _chi_square(*marg)
        assert df >= 2 and p > 1e-3, (pos, stat, df, p)
    # and the test sees a real difference: the drafts' tokens forced half the time
    skewed = Counter()
    for t, count in samples[False].items():
        forced = (t[0], *table.get(t[0], t[1:3]), t[3])
        skewed[forced] += count // 2
        skewed[t] += count - count // 2
    assert _chi_square(skewed, samples[False])[2] < 1e-6


def test_chi_square_helper():
    # 60/40 against 40/60: statistic 8 on 1 degree of freedom, p = 0.00468
    stat, df, p = _chi_square(Counter(a=60, b=40), Counter(a=40, b=60))
    assert (stat, df) == (8.0, 1) and math.isclose(p, 0.00468, rel_tol=0.01)


@pytest.mark.timeout(900)
@pytest.mark.parametrize("quantization", ["auto", "none"], ids=["gguf-blocks", "float32"])
def test_default_model_seeded_equal_with_ngram(default_model_dir, quantization):
    """The embedded SmolLM2 at temperature 0.7, top_p 0.9, seeded, with prompt-lookup
    drafts on prompts that repeat text: the same tokens as without drafts."""
    from common.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
    from scheduler_worker.engine import LLMEngine
    from tests.scheduler_worker.test_spec_default_model import _prompts

    engine = LLMEngine(
        EngineConfig(
            model=ModelConfig(model="smollm2", dtype="float32", quantization=quantization),
            cache=CacheConfig(num_blocks=128),
            scheduler=SchedulerConfig(
                max_num_seqs=4,
                speculative_method="ngram",
                num_speculative_tokens=5,
                speculative_policy="always",
            ),
        ),
        default_model_dir,
    )
    prompts = _prompts(default_model_dir)
    outs = {}
    for spec in (False, True):  # one engine: the request's flag switches the drafts
        params = SamplingParams(
            max_tokens=64, temperature=0.7, top_p=0.9, seed=1234, speculative=spec
        )
        outs[spec] = engine.generate(prompts, params)
    c = engine.counters
    assert c.accepted_tokens > 20 and c.draft_tokens > c.accepted_tokens
    for i, (got, want) in enumerate(zip(outs[True], outs[False], strict=True)):
        assert got == want, f"prompt {i}: first difference at token " + str(
            next((j for j, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
        )
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
