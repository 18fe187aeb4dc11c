"""Speculative decoding with structured outputs (GrammarMatchers.check_drafts, the
masked verify of spec/verify.py): a constrained greedy row's drafts are cut at the first
token its grammar refuses and verified against the masked argmax, so its output and finish
reason are those without drafts, whatever the drafts: right ones that run to the grammar's
end, wrong ones, ones the grammar refuses.

The tiny random llama carries the default model's tokenizer, so the grammars are the real
ones; its random weights make every constrained token one the mask forced."""

from __future__ import annotations

import json
import random

import jsonschema
import pytest

from benchmarks.bench_spec_json import ORDER_SCHEMA, STRUCTURED, chat_prompt
from common.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from common.sampling_params import SamplingParams
from scheduler_worker.engine import LLMEngine
from scheduler_worker.spec.ngram import NgramDrafter
from tests.scheduler_worker.test_engine import make_engine
from tests.scheduler_worker.test_spec_ngram import OracleDrafter
from tests.scheduler_worker.test_structured import SPECS, check_against_library

SIZES = [4, 8, 12, 16, 20]  # prompt lengths (the oracle finds a prompt by its tokens)
# test_structured's grammars, the choice's strings long enough to draft
CHOICE = ["the red house by the river", "the green door", "a blue bird over the sea"]
SPECS = [s if s["kind"] != "choice" else {**s, "spec": json.dumps(CHOICE)} for s in SPECS]


class NoisyDrafter:
    """Random tokens of the request's own (the grammar refuses most), and every other
    call the oracle's drafts with one token changed: cuts at every position."""

    def __init__(self, oracle: OracleDrafter, seed: int) -> None:
        self.oracle, self.rng = oracle, random.Random(seed)
        self.proposed = 0

    def observe(self, prompt_token_ids, output_token_ids):
        pass  # learns nothing across requests

    def propose(self, token_ids, state, k):
        drafts, state = self.oracle.propose(token_ids, state, k)
        if self.rng.random() < 0.5:
            drafts = [self.rng.choice(token_ids) for _ in range(k)]
        elif drafts:
            drafts[self.rng.randrange(len(drafts))] = self.rng.choice(token_ids)
        self.proposed += len(drafts)
        return drafts, state


class Counted:
    def __init__(self, drafter) -> None:
        self.drafter, self.proposed = drafter, 0

    def observe(self, prompt_token_ids, output_token_ids):
        self.drafter.observe(prompt_token_ids, output_token_ids)

    def propose(self, token_ids, state, k):
        drafts, state = self.drafter.propose(token_ids, state, k)
        self.proposed += len(drafts)
        return drafts, state


def _params(spec, **kw) -> SamplingParams:
    return SamplingParams(**{"max_tokens": 40, "temperature": 0.0, "structured": spec, **kw})


def _run(model_dir, prompts, params, drafter=None, steps=None, **setup):
    """Each request's (tokens, finish reason), added one every other step; `steps` collects
    (tokens in one output, its finish reason) of every output."""
    extra = dict(speculative_method="ngram", num_speculative_tokens=4) if drafter else {}
    extra = extra or {"speculative_method": "none"}  # no drafter: the plain path
    engine = make_engine(model_dir, **{**setup, **extra})
    if drafter is not None:
        engine.scheduler.drafter = drafter
    got: dict[str, tuple[list[int], str | None]] = {}
    pending, step = list(enumerate(prompts)), 0
    while pending or engine.has_unfinished():
        if pending and step % 2 == 0:
            i, p = pending.pop(0)
            engine.add_request(f"r{i}", p, params[i] if isinstance(params, list) else params)
            got[f"r{i}"] = ([], None)
        for out in engine.step():
            tokens, _ = got[out.request_id]
            got[out.request_id] = (tokens + out.new_token_ids, out.finish_reason)
            if steps is not None:
                steps.append((out.new_token_ids, out.finish_reason))
        step += 1
    engine.block_manager.check_integrity()
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
    assert len(engine.grammars) == 0, "every finished request's matcher is dropped"
    return [got[f"r{i}"] for i in range(len(prompts))], engine.counters


@pytest.fixture(scope="module")
def llama(tiny_model_dirs):
    return tiny_model_dirs["llama"]


@pytest.fixture(scope="module")
def tok(llama):
    from common.grammar import llg_tokenizer

    return llg_tokenizer(str(llama), 49152)


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    rng = random.Random(5)
    return [[rng.randrange(3, 49152) for _ in range(n)] for n in SIZES]


@pytest.mark.timeout(900)
@pytest.mark.parametrize("spec", SPECS, ids=[s["kind"] for s in SPECS[:-1]] + ["json-ws"])
def test_constrained_greedy_equal_whatever_the_drafts(llama, tok, prompts, spec):
    params = _params(spec)
    want, _ = _run(llama, prompts, params)
    for tokens, reason in want:
        check_against_library(tok, spec, tokens, reason)
    oracle = OracleDrafter(prompts, [t for t, _ in want])
    steps: list = []
    got, counters = _run(llama, prompts, params, oracle, steps)
    assert got == want
    assert counters.accepted_tokens > 0
    if spec["kind"] in ("json", "choice", "grammar"):
        # a run of accepted drafts reached the grammar's end: the row stopped there
        assert any(len(t) > 1 and r == "stop" for t, r in steps)
    noisy = NoisyDrafter(OracleDrafter(prompts, [t for t, _ in want]), seed=1)
    got, counters = _run(llama, prompts, params, noisy)
    assert got == want
    assert counters.draft_tokens < noisy.proposed  # the grammar cut drafts...
    assert counters.accepted_tokens > 0  # ...and kept some that the model took
    wrong = OracleDrafter(prompts, [t for t, _ in want], wrong=True)
    got, _ = _run(llama, prompts, params, wrong)
    assert got == want


@pytest.mark.timeout(900)
@pytest.mark.parametrize(
    "setup",
    [dict(num_blocks=24), dict(max_num_batched_tokens=9), dict(async_scheduling="on")],
    ids=["preemption", "small-budget", "overlapped"],
)
def test_mixed_batches_stay_exact(llama, prompts, setup):
    """Constrained rows of every kind beside free ones (and sampled ones, which draft
    nothing), through preemption, a small token budget and overlapped scheduling, where
    a step that drafts resolves the one in flight first (spec/overlap.py) and the others
    keep every row's token in flight (a grammar row's mask made after the forward)."""
    rng = random.Random(3)
    specs = [rng.choice([*SPECS, None]) for _ in prompts]
    params = [_params(s, ignore_eos=s is None) for s in specs]
    params[1] = SamplingParams(max_tokens=20, temperature=0.9, seed=4, structured=SPECS[0])
    want, _ = _run(llama, prompts, params, **setup)
    oracle = OracleDrafter(prompts, [t for t, _ in want], wrong=True)
    got, counters = _run(llama, prompts, params, oracle, **setup)
    assert got == want
    assert counters.accepted_tokens > 0


def test_ngram_drafts_on_a_schema_that_repeats(llama):
    """Prompt lookup over a constrained output: an array of one repeated object, drafted
    from the output itself; cut where the schema refuses (after maxItems)."""
    schema = {
        "type": "array",
        "items": {"type": "object", "properties": {"a": {"enum": ["x", "y"]}}, "required": ["a"]},
        "minItems": 6,
        "maxItems": 6,
    }
    spec = {"kind": "json", "spec": json.dumps(schema)}
    prompts = [[5, 6, 7, 8], [9, 10, 11]]
    want, _ = _run(llama, prompts, _params(spec, max_tokens=80))
    drafter = Counted(NgramDrafter())
    got, counters = _run(llama, prompts, _params(spec, max_tokens=80), drafter)
    assert got == want and all(r == "stop" for _, r in got)
    assert counters.accepted_tokens > 0
    assert counters.draft_tokens < drafter.proposed


@pytest.mark.timeout(900)
@pytest.mark.parametrize("quantization", ["auto", "none"], ids=["gguf-blocks", "float32"])
def test_default_model_json_schema_equal_with_ngram(default_model_dir, quantization):
    """The default model asked for an order record back as JSON under its schema: prompt
    lookup drafts the record from the prompt, the grammar cuts the drafts at the prompt's
    spaces (the schema's JSON is compact), the rest are verified; the output is the one
    without drafts, valid against the schema."""
    engine = LLMEngine(
        EngineConfig(
            model=ModelConfig(model="smollm2", dtype="float32", quantization=quantization),
            cache=CacheConfig(num_blocks=128),
            scheduler=SchedulerConfig(
                max_num_seqs=4, speculative_method="ngram", num_speculative_tokens=4
            ),
        ),
        default_model_dir,
    )
    drafter = engine.scheduler.drafter = Counted(engine.scheduler.drafter)
    prompt = chat_prompt(default_model_dir, "json")
    outs = {}
    for spec in (False, True):
        params = SamplingParams(
            max_tokens=160, temperature=0.0, speculative=spec, structured=STRUCTURED["json"]
        )
        outs[spec] = engine.generate([prompt], params)[0]
    assert outs[True] == outs[False]
    assert engine.counters.accepted_tokens > 10  # drafts accepted...
    assert engine.counters.draft_tokens < drafter.proposed  # ...and some cut by the grammar
    text = engine.grammars.tokenizer.decode_str(outs[True])
    jsonschema.validate(json.loads(text), ORDER_SCHEMA)
    assert len(engine.grammars) == 0
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


@pytest.mark.timeout(900)
def test_stops_and_max_tokens_inside_accepted_drafts(llama, prompts, caplog):
    """A stop token or max_tokens inside a run of accepted drafts of a constrained row ends
    it there, as without drafts (the matcher takes nothing after it: no refusal logged)."""
    spec = SPECS[0]
    want, _ = _run(llama, prompts[:1], _params(spec))
    (out, _), oracle = want[0], OracleDrafter(prompts[:1], [want[0][0]])
    stops = [t for j, t in enumerate(out[:10]) if t not in out[:j]]
    cases = [_params(spec, stop_token_ids=[t]) for t in stops]
    cases += [_params(spec, max_tokens=m) for m in range(1, 10)]
    for params in cases:
        want, _ = _run(llama, prompts[:1], params)
        got, _ = _run(llama, prompts[:1], params, oracle)
        assert got == want, params
    assert "grammar refused" not in caplog.text
