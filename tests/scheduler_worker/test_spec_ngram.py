"""Speculative decoding with prompt-lookup drafts (scheduler_worker/spec/): the drafter's
proposals, and greedy outputs with speculation equal to those without, token for token,
through stops, max_tokens and preemption."""

from __future__ import annotations

import random

import pytest

from common.cli import parse_config
from common.config import ConfigError, SchedulerConfig
from common.sampling_params import SamplingParams
from scheduler_worker.spec.ngram import NgramDrafter
from scheduler_worker.spec.verify import accepted_tokens
from tests.scheduler_worker.test_engine import make_engine, run_staggered


def test_ngram_proposes_what_followed_the_latest_match():
    d = NgramDrafter(min_n=1, max_n=3)
    tokens = [1, 2, 3, 9, 9, 1, 2, 3, 7, 8, 5, 1, 2, 3]
    drafts, _ = d.propose(tokens, None, 2)
    assert drafts == [7, 8]  # [1, 2, 3] last seen before the suffix at 5..7
    drafts, _ = d.propose(tokens, None, 10)
    assert drafts == [7, 8, 5, 1, 2, 3, 7, 8, 5, 1]  # past the end: a repeat of its period
    assert d.propose([4, 5, 6], None, 3)[0] == []  # nothing repeats
    assert d.propose([5, 6, 5], None, 3)[0] == [6, 5, 6]  # a 1-gram match
    assert d.propose([4, 9, 9, 9], None, 3)[0] == [9, 9, 9]
    # the longest n first: [2, 3] matches at the end of both; only the 3-gram tells
    tokens = [0, 2, 3, 4, 1, 2, 3, 6, 1, 2, 3]
    assert d.propose(tokens, None, 1)[0] == [6]
    assert NgramDrafter(min_n=1, max_n=2).propose(tokens, None, 1)[0] == [6]
    assert NgramDrafter(min_n=3, max_n=3).propose([0, 2, 3, 4, 2, 3], None, 1)[0] == []


def test_ngram_index_grows_with_the_tokens():
    d = NgramDrafter()
    tokens = [1, 2, 3, 4]
    drafts, state = d.propose(tokens, None, 3)
    assert drafts == []
    rng = random.Random(0)
    for _ in range(200):  # incremental state == a fresh index, at every length
        tokens.append(rng.randrange(6))
        drafts, state = d.propose(tokens, state, 3)
        assert drafts == d.propose(tokens, None, 3)[0]


def test_accepted_tokens():
    assert accepted_tokens([5, 6, 7], [5, 6, 7], 8) == [5, 6, 7, 8]  # all, then the bonus
    assert accepted_tokens([5, 6, 7], [5, 9, 7], 8) == [5, 9]
    assert accepted_tokens([5, 6, 7], [4, 6, 7], 8) == [4]
    assert accepted_tokens([], [], 8) == [8]


@pytest.mark.parametrize("k", [0, 17, True, "3"])
def test_num_speculative_tokens_out_of_range_refused(k):
    with pytest.raises(ConfigError, match="num_speculative_tokens"):
        SchedulerConfig(num_speculative_tokens=k)
    with pytest.raises(ConfigError, match="speculative_method"):
        SchedulerConfig(speculative_method="eagle")


def test_flags(capsys):
    cfg = parse_config("t", ["--speculative-method", "ngram", "--num-speculative-tokens", "7"])
    assert cfg.engine.scheduler.speculative_method == "ngram"
    assert cfg.engine.scheduler.num_speculative_tokens == 7
    assert parse_config("t", []).engine.scheduler.speculative_method == "auto"
    with pytest.raises(SystemExit) as e:  # refused at start, in one line
        parse_config("t", ["--num-speculative-tokens", "17"])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and "num_speculative_tokens" in err and "\n" not in err


def _repetitive(n: int, seed: int) -> list[list[int]]:
    """Prompts that repeat a phrase (prompt lookup finds matches) with noise between."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        phrase = [rng.randrange(3, 500) for _ in range(rng.randrange(3, 8))]
        p: list[int] = []
        for _ in range(rng.randrange(2, 5)):
            p += phrase + [rng.randrange(3, 500) for _ in range(rng.randrange(0, 3))]
        out.append(p)
    return out


class OracleDrafter:
    """Drafts each prompt's known greedy continuation (`wrong`: every third draft off by
    one), so that runs of accepted drafts are long and hold tokens seen nowhere before."""

    def __init__(self, prompts: list[list[int]], outputs: list[list[int]], wrong=False):
        self.known = {tuple(p): o for p, o in zip(prompts, outputs)}
        self.wrong = wrong

    def observe(self, prompt_token_ids, output_token_ids):
        pass  # learns nothing across requests

    def propose(self, token_ids, state, k):
        if state is None:
            state = next(p for p in self.known if list(p) == token_ids[: len(p)])
        n = len(token_ids) - len(state)
        drafts = list(self.known[state][n : n + k])
        if self.wrong:
            drafts = [t + (j % 3 == 2) for j, t in enumerate(drafts, n)]
        return drafts, state


def _run(model_dir, prompts, params, spec, runs: list | None = None, **setup):
    """Outputs and counters of an engine with ngram drafts (spec True), another drafter's,
    or none (False); `runs` collects (request id, tokens verified, tokens kept) of each
    verified row."""
    # "always": every draft verified (the adaptive switch is test_spec_policy.py's)
    extra = dict(speculative_method="ngram", num_speculative_tokens=4, speculative_policy="always")
    extra = extra if spec else {"speculative_method": "none"}
    engine = make_engine(model_dir, **{**setup, **extra})
    if spec not in (True, False):
        engine.scheduler.drafter = spec
    if runs is not None:
        accept = engine.scheduler.accept

        def watched(req, index, tokens):
            kept = accept(req, index, tokens)
            runs.append((req.request_id, tokens, kept))
            return kept

        engine.scheduler.accept = watched  # type: ignore[method-assign]
    outs = run_staggered(engine, prompts, params)
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
    return outs, engine.counters


@pytest.fixture(scope="module")
def llama(tiny_model_dirs):
    return tiny_model_dirs["llama"]


@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    "setup",
    [dict(), dict(num_blocks=20, max_num_seqs=8), dict(max_num_batched_tokens=9)],
    ids=["default", "preemption", "small-budget"],
)
def test_greedy_equal_with_ngram_drafts(llama, setup):
    prompts = _repetitive(10, seed=1)
    params = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    want, _ = _run(llama, prompts, params, False, **setup)
    got, counters = _run(llama, prompts, params, True, **setup)
    assert got == want
    assert counters.accepted_tokens > 0  # drafts pay...
    assert counters.draft_tokens > counters.accepted_tokens  # ...and some are refused
    assert counters.generation_tokens == sum(map(len, got))


@pytest.mark.timeout(600)
@pytest.mark.parametrize("wrong", [False, True], ids=["right", "some-wrong"])
def test_stops_and_max_tokens_inside_an_accepted_run(llama, wrong):
    """A stop token or max_tokens that falls inside a run of accepted drafts ends the
    output there, as when the tokens come one by one (drafts from an oracle, so that
    the runs are long)."""
    prompts = _repetitive(3, seed=2)
    base = SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True)
    plain, _ = _run(llama, prompts, base, False)
    oracle = OracleDrafter(prompts, plain, wrong)
    runs: list = []
    for i, out in enumerate(plain):
        # stops: tokens not output before (the first occurrence ends the output there)
        stops = [(j, t) for j, t in enumerate(out[:12]) if t not in out[:j]]
        cases = [
            SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True, stop_token_ids=[t])
            for _, t in stops
        ] + [SamplingParams(max_tokens=m, temperature=0.0, ignore_eos=True) for m in range(1, 12)]
        for params in cases:
            want, _ = _run(llama, [prompts[i]], params, False)
            got, _ = _run(llama, [prompts[i]], params, oracle, runs)
            assert got == want, (i, params)
    # some verified runs were cut by a stop token (kept fewer than verified)
    assert any(len(kept) < len(tokens) for _, tokens, kept in runs)


def test_request_can_turn_speculation_off(llama):
    prompts = _repetitive(4, seed=3)
    params = SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True, speculative=False)
    _, counters = _run(llama, prompts, params, True)
    assert counters.draft_tokens == 0
    sampled = SamplingParams(
        max_tokens=30, temperature=0.8, seed=1, ignore_eos=True, speculative=False
    )
    _, counters = _run(llama, prompts, sampled, True)  # sampled rows: the same switch
    assert counters.draft_tokens == 0


def test_speculative_extra_body_field_reaches_the_params():
    import json

    from common.config import ServerConfig
    from frontend.api.openai_protocol import ChatCompletionRequest
    from frontend.api.openai_sampling import sampling_params
    from frontend.errors import APIError
    from frontend.intake import parse

    def params(**extra):
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], **extra}
        req = parse(ChatCompletionRequest, json.dumps(body).encode())
        params, _ = sampling_params(req, 8, None, None, ServerConfig())
        return params[0]

    assert params().speculative is True
    assert params(speculative=False).speculative is False
    with pytest.raises(APIError) as e:
        params(speculative="maybe")
    assert e.value.status == 400 and "speculative" in str(e.value)


def test_drafted_and_accepted_counts_reach_the_timings_and_metrics(llama):
    """Per request in the finishing output's stage times (the usage's `timings`), and
    summed in /metrics' counters."""
    from frontend.metrics import Metrics, shown_timings
    from scheduler_worker.step_message import finished_timings

    engine = make_engine(llama, speculative_method="ngram", num_speculative_tokens=4)
    params = SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True)
    outputs = []
    for i, prompt in enumerate(_repetitive(2, seed=5)):
        engine.add_request(f"r{i}", prompt, params)
    while engine.has_unfinished():
        outputs += engine.step()
    last = [o for o in outputs if o.finish_reason is not None]
    timings = [finished_timings(o, None, 0.0) for o in last]
    drafted = sum(t.get("num_draft_tokens", 0) for t in timings)
    accepted = sum(t.get("num_accepted_tokens", 0) for t in timings)
    assert drafted == engine.counters.draft_tokens > accepted == engine.counters.accepted_tokens
    assert accepted > 0
    shown = [shown_timings(t) or {} for t in timings]  # the usage's, with return_timings
    assert sum(s.get("num_accepted_tokens", 0) for s in shown) == accepted
    metrics = Metrics()
    for o, t in zip(last, timings):
        metrics.on_finished("length", 1.0, o.num_prompt_tokens, o.num_output_tokens, t)
    text = metrics.render().decode()
    assert f'zeroserve:spec_decode_num_draft_tokens_total{{engine="0"}} {float(drafted)}' in text
    assert (
        f'zeroserve:spec_decode_num_accepted_tokens_total{{engine="0"}} {float(accepted)}' in text
    )


def test_abort_between_verify_steps_frees_every_block(llama):
    """Rows aborted right after a verify step (their drafts' blocks taken, some drafts
    refused) give every block back; the other rows' outputs are unchanged."""
    prompts = _repetitive(4, seed=3)
    params = SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True)
    plain, _ = _run(llama, prompts, params, False)
    engine = make_engine(
        llama, speculative_method="ngram", num_speculative_tokens=4, speculative_policy="always"
    )
    engine.scheduler.drafter = OracleDrafter(prompts, plain, wrong=True)
    outs: dict[str, list[int]] = {}
    for i, p in enumerate(prompts):
        engine.add_request(f"r{i}", p, params)
        outs[f"r{i}"] = []
    aborted = False
    while engine.has_unfinished():
        verifies = engine.counters.verify_steps
        for out in engine.step():
            outs[out.request_id].extend(out.new_token_ids)
        if not aborted and engine.counters.verify_steps > verifies and len(outs["r1"]) > 4:
            assert engine.abort("r1") and engine.abort("r3")  # mid-generation, drafts held
            aborted = True
    assert aborted
    assert outs["r0"] == plain[0] and outs["r2"] == plain[2]
    assert len(outs["r1"]) < 30 and len(outs["r3"]) < 30
    engine.block_manager.check_integrity()
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
