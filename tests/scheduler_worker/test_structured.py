"""Constrained decoding in the engine, against llguidance's own matcher.

The tiny random llama carries the default model's tokenizer (49,152 tokens), so the
grammars are the real ones; its random weights make every constrained token a choice
the mask had to force.
"""

from __future__ import annotations

import json
import os
import random
import re

import jsonschema
import llguidance
import pytest
import torch

from common.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from common.grammar import grammar_text, llg_tokenizer
from common.sampling_params import InvalidParameterError, SamplingParams
from scheduler_worker.engine import LLMEngine
from scheduler_worker.sampling import Sampler, SamplingRow
from scheduler_worker.structured import masks_overlap, spare_core

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3},
    },
    "required": ["name", "age", "tags"],
    "additionalProperties": False,
}
SPECS = [
    {"kind": "json", "spec": json.dumps(SCHEMA)},
    {"kind": "regex", "spec": "[0-9]{3}-[a-z]{2,4}"},
    {"kind": "choice", "spec": json.dumps(["red", "green", "blue"])},
    {"kind": "json_object", "spec": ""},
    {"kind": "grammar", "spec": 'start: "(" NUM ("," NUM)* ")"\nNUM: /[0-9]{1,3}/\n'},
    {"kind": "json", "spec": json.dumps(SCHEMA), "whitespace_pattern": "[ ]?"},
]


def make_engine(model_dir, num_blocks=512, kernels="auto", **sched) -> LLMEngine:
    cfg = EngineConfig(
        model=ModelConfig(model=str(model_dir), dtype="float32", kernels=kernels),
        cache=CacheConfig(block_size=4, num_blocks=num_blocks),
        scheduler=SchedulerConfig(**{"max_num_seqs": 16, "max_num_batched_tokens": 64, **sched}),
    )
    return LLMEngine(cfg, model_dir)


@pytest.fixture(scope="module")
def engine(tiny_llama_dir) -> LLMEngine:
    return make_engine(tiny_llama_dir)


@pytest.fixture(scope="module")
def tok(tiny_llama_dir) -> llguidance.LLTokenizer:
    return llg_tokenizer(str(tiny_llama_dir), 49152)


def pack(allowed: torch.Tensor) -> torch.Tensor:
    """bool [V] -> int32 [ceil(V / 32)]: bit j of word w = allowed[32 w + j]."""
    bits = torch.zeros((allowed.numel() + 31) // 32 * 32, dtype=torch.int64)
    bits[: allowed.numel()] = allowed.long()
    words = (bits.view(-1, 32) << torch.arange(32)).sum(1)
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


def _prompts(n: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, 49152) for _ in range(rng.randrange(1, 20))] for _ in range(n)]


def run(engine: LLMEngine, prompts, params) -> list[tuple[list[int], str | None]]:
    """Each request's (output tokens, finish reason)."""
    rids = [f"r{i}" for i in range(len(prompts))]
    for rid, p, sp in zip(rids, prompts, params):
        engine.add_request(rid, p, sp)
    got: dict[str, tuple[list[int], str | None]] = {rid: ([], None) for rid in rids}
    while engine.has_unfinished():
        for out in engine.step():
            toks, _ = got[out.request_id]
            got[out.request_id] = (toks + out.new_token_ids, out.finish_reason)
    assert len(engine.grammars) == 0, "every finished request's matcher is dropped"
    return [got[rid] for rid in rids]


def check_against_library(tok, spec, tokens: list[int], reason: str | None) -> None:
    """Replay the output in a fresh llguidance matcher: each token was allowed by the
    library's own mask; a "stop" ends where the grammar may end."""
    m = llguidance.LLMatcher(tok, grammar_text(spec))
    for i, t in enumerate(tokens):
        words = torch.frombuffer(bytearray(m.compute_bitmask()), dtype=torch.int32)
        mask = {32 * w + j for w, x in enumerate(words.tolist()) for j in range(32) if x >> j & 1}
        if t == 2:  # EOS: the last token, allowed only where the grammar accepts
            assert i == len(tokens) - 1 and m.is_accepting() and 2 in mask
            break
        assert t in mask, f"token {t} at {i} outside the library's mask"
        assert m.consume_token(t), m.get_error()
    if reason == "stop":
        assert m.is_accepting()


def test_masks_match_the_library_on_mixed_batches(engine, tok):
    rng = random.Random(7)
    for trial in range(3):
        n = 12
        specs = [rng.choice([*SPECS, None, None]) for _ in range(n)]
        params = [
            SamplingParams(
                max_tokens=24, temperature=1.0, seed=rng.randrange(1 << 30), structured=s
            )
            for s in specs
        ]
        outs = run(engine, _prompts(n, trial), params)
        for spec, (tokens, reason) in zip(specs, outs):
            assert reason in ("stop", "length")
            if spec is not None:
                check_against_library(tok, spec, tokens, reason)
        stopped = [
            t
            for s, (t, r) in zip(specs, outs)
            if s is not None and s["kind"] == "json" and r == "stop"
        ]
        for tokens in stopped:
            text = tok.decode_str([t for t in tokens if t != 2])
            jsonschema.validate(json.loads(text), SCHEMA)


def test_choice_and_regex_outputs_are_exact(engine, tok):
    params = [
        SamplingParams(max_tokens=16, temperature=1.0, seed=i, structured=SPECS[2])
        for i in range(4)
    ] + [
        SamplingParams(max_tokens=16, temperature=1.0, seed=i, structured=SPECS[1])
        for i in range(4)
    ]
    for (tokens, reason), p in zip(run(engine, _prompts(8, 3), params), params):
        text = tok.decode_str([t for t in tokens if t != 2])
        assert reason == "stop"
        if p.structured == SPECS[2]:
            assert text in ("red", "green", "blue")  # finished by the grammar, no EOS needed
        else:
            assert re.fullmatch("[0-9]{3}-[a-z]{2,4}", text), text


@pytest.mark.parametrize("kernels", ["torch"])
def test_masks_in_torch_on_the_engine_s_own_logits(tiny_llama_dir, tok, kernels):
    """The masks written into the step's logits in torch (a GPU's path, and --kernels
    torch): greedy and sampled rows, overlapped scheduling on."""
    engine = make_engine(tiny_llama_dir, kernels=kernels, async_scheduling="on")
    params = [
        SamplingParams(max_tokens=16, temperature=0.0, structured=SPECS[2]),
        SamplingParams(max_tokens=16, temperature=1.0, seed=1, structured=SPECS[1]),
        SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True),
    ]
    outs = run(engine, _prompts(3, 5), params)
    assert tok.decode_str([t for t in outs[0][0] if t != 2]) in ("red", "green", "blue")
    assert re.fullmatch("[0-9]{3}-[a-z]{2,4}", tok.decode_str([t for t in outs[1][0] if t != 2]))
    assert len(outs[2][0]) == 6


def test_free_rows_are_untouched_by_constrained_ones(engine):
    """Greedy free rows give the same tokens alone and beside constrained rows."""
    free = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    prompts = _prompts(6, 11)
    alone = run(engine, prompts[:3], [free] * 3)
    mixed = run(
        engine,
        prompts,
        [free] * 3
        + [
            SamplingParams(max_tokens=12, temperature=1.0, seed=i, structured=SPECS[0])
            for i in range(3)
        ],
    )
    assert mixed[:3] == alone


def test_sampler_masks_only_constrained_rows():
    torch.manual_seed(0)
    logits = torch.randn(4, 100)
    allowed = torch.zeros(100, dtype=torch.bool)
    allowed[[5, 17, 60]] = True
    words = pack(allowed)
    for step in range(20):
        sp = [SamplingParams(temperature=1.0, logprobs=2, seed=100 * step + i) for i in range(4)]
        rows = [
            SamplingRow(sp[i], [1], [], token_bitmask=words if i % 2 else None) for i in range(4)
        ]
        free = [SamplingRow(sp[i], [1], []) for i in range(4)]
        out, ref = Sampler(100, [2])(logits, rows), Sampler(100, [2])(logits, free)
        assert out.token_ids[1] in (5, 17, 60) and out.token_ids[3] in (5, 17, 60)
        assert out.token_ids[0] == ref.token_ids[0] and out.token_ids[2] == ref.token_ids[2]
        # logprobs are the model's, before the mask: the same top-N as unconstrained
        assert out.logprobs[1].top_ids == ref.logprobs[1].top_ids  # type: ignore[union-attr]
    greedy = SamplingParams(temperature=0.0)
    rows = [SamplingRow(greedy, [1], [], token_bitmask=words), SamplingRow(greedy, [1], [])]
    out = Sampler(100, [2])(logits[:2], rows)
    assert out.token_ids[0] == int(torch.tensor([5, 17, 60])[logits[0, [5, 17, 60]].argmax()])
    assert out.token_ids[1] == int(logits[1].argmax())


@pytest.mark.parametrize(
    "setup",
    [dict(num_blocks=20, max_num_seqs=8), dict(max_num_batched_tokens=5)],
    ids=["preemption", "chunked-prefill"],
)
def test_greedy_constrained_outputs_survive_preemption_and_chunking(
    tiny_llama_dir, engine, tok, setup
):
    """Greedy constrained outputs do not depend on batching: the same with preemption by
    recompute in the middle of them (the matcher keeps its state: the tokens are kept)."""
    prompts = _prompts(8, 5)
    params = [
        SamplingParams(max_tokens=20, temperature=0.0, structured=SPECS[i % 2 * 4])
        for i in range(8)
    ]
    expected = run(engine, prompts, params)
    small = make_engine(tiny_llama_dir, **setup)
    got = run(small, prompts, params)
    assert got == expected
    if "num_blocks" in setup:
        assert small.scheduler.num_preemptions > 0
    for p, (tokens, reason) in zip(params, got):
        check_against_library(tok, p.structured, tokens, reason)


def test_masks_in_the_thread_equal_masks_at_once(engine):
    """The mask thread (used where a core is spare beside torch's threads) gives the
    outputs the at-once path gives; this machine's default is printed by the assertion."""
    prompts = _prompts(6, 9)
    params = [
        SamplingParams(max_tokens=16, temperature=1.0, seed=i, structured=SPECS[i % 3])
        for i in range(6)
    ]
    default = engine.grammars.overlap
    try:
        got = {}
        for overlap in (True, False):
            engine.grammars.overlap = overlap
            got[overlap] = run(engine, prompts, params)
    finally:
        engine.grammars.overlap = default
    assert got[True] == got[False], f"default overlap here: {default}"


def test_a_mask_thread_needs_a_core_no_replica_uses(monkeypatch):
    cores = len(os.sched_getaffinity(0))
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    assert spare_core(1) == (cores > 1)
    assert not spare_core(cores)  # as many single-thread replicas as cores: none spare
    monkeypatch.setattr(torch, "get_num_threads", lambda: cores)
    assert not spare_core(1)  # torch's default: every core


def test_a_gpu_makes_its_masks_in_the_thread_with_no_core_spare(monkeypatch):
    """Where the device runs the forward (a GPU) the mask thread overlaps it whatever
    torch's CPU threads are; on a CPU it takes a spare core only."""
    cores = len(os.sched_getaffinity(0))
    monkeypatch.setattr(torch, "get_num_threads", lambda: cores)  # torch's default
    assert masks_overlap(True) and masks_overlap(True, 4)
    assert not masks_overlap(False) and masks_overlap(False) == spare_core(1)


def test_rebuild_replays_the_output(engine, tok):
    spec = SPECS[0]
    engine.add_request(
        "rb", [5, 6, 7], SamplingParams(max_tokens=6, temperature=1.0, seed=3, structured=spec)
    )
    for _ in range(4):
        engine.step()
    req = engine.requests["rb"]
    assert req.output_token_ids
    live = engine.grammars.matchers["rb"].deep_copy()
    engine.grammars.rebuild(req)
    rebuilt = engine.grammars.matchers["rb"]
    assert rebuilt.compute_bitmask() == live.compute_bitmask()
    engine.abort("rb")
    engine.step()
    assert "rb" not in engine.grammars


def test_bad_spec_is_refused_by_the_engine(engine):
    for spec in (
        {"kind": "regex", "spec": "[a-"},
        {"kind": "json", "spec": "{not json"},
        {"kind": "grammar", "spec": "start: nothing_defined"},
        {"kind": "choice", "spec": "[]"},
    ):
        with pytest.raises(InvalidParameterError) as e:
            engine.add_request("bad", [5], SamplingParams(structured=spec))
        assert e.value.param == "structured"
    with pytest.raises(InvalidParameterError):
        SamplingParams(structured={"kind": "xml", "spec": ""}).validate()
    with pytest.raises(InvalidParameterError):
        SamplingParams(structured={"kind": "json", "spec": "{}", "extra": "1"}).validate()
    assert not engine.has_unfinished()


def test_grammars_that_name_tokens_compile_in_the_engine(engine):
    # checked against the tokenizer only when the grammar names tokens (common.grammar.check)
    spec = {"kind": "grammar", "spec": "start: <[1000]> <[2000]>"}
    ((tokens, reason),) = run(engine, [[5, 6, 7]], [SamplingParams(max_tokens=8, structured=spec)])
    assert tokens[:2] == [1000, 2000] and reason == "stop"
    with pytest.raises(InvalidParameterError) as e:
        engine.add_request(
            "t",
            [5],
            SamplingParams(structured={"kind": "grammar", "spec": "start: <|no_such_token|>"}),
        )
    assert e.value.param == "structured"
    assert not engine.has_unfinished()


def test_a_model_without_a_tokenizer_refuses_constrained_requests(tiny_model_dirs):
    engine = make_engine(tiny_model_dirs["qwen2"])  # saved without tokenizer files
    with pytest.raises(InvalidParameterError) as e:
        engine.add_request("c", [5], SamplingParams(structured=SPECS[1]))
    assert e.value.param == "structured" and "not available" in str(e.value)
    assert engine.generate([[5, 6]], SamplingParams(max_tokens=3)) != [[]]  # the rest serves


def test_a_grammar_that_breaks_mid_way_fails_the_request_not_stops_it(engine):
    """A choice of 2,001 strings with one prefix compiles, then passes llguidance's limit
    of 2,000 Earley items once the prefix is consumed: the request fails with an error
    naming it (never a "stop" whose text is not one of the choices), its matcher and blocks
    are freed, and the request beside it ends as it would alone."""
    many = {"kind": "choice", "spec": json.dumps([f"item-{i:05d}" for i in range(2001)])}
    ok = SamplingParams(max_tokens=8, temperature=0, structured=SPECS[1])
    ((alone, alone_reason),) = run(engine, [[5, 6, 7]], [ok])
    engine.add_request(
        "broken", [5, 6, 7], SamplingParams(max_tokens=8, temperature=0, structured=many)
    )
    engine.add_request("ok", [5, 6, 7], ok)
    got: dict[str, list] = {"broken": [], "ok": []}
    reasons = {}
    while engine.has_unfinished():
        for out in engine.step():
            got[out.request_id] += out.new_token_ids
            reasons[out.request_id] = out.finish_reason
    assert (got["ok"], reasons["ok"]) == (alone, alone_reason)
    assert reasons.get("broken") is None  # no output ended it
    ((rid, message, status),) = engine.take_failed()
    assert (rid, status) == ("broken", 400)
    assert message.startswith("structured: the grammar could not go on: Parser Error")
    assert "2000" in message and "<grammar>" not in message
    assert len(engine.grammars) == 0 and not engine.grammars.refused
    bm = engine.block_manager
    assert bm.num_free_blocks == bm.num_blocks


def test_a_grammar_that_names_eos_may_end_on_it(engine):
    """EOS is allowed where the grammar itself names it, not only where it accepts: a
    grammar that spells out the stop token ends on it ("stop"), not on a refused token."""
    spec = {"kind": "grammar", "spec": 'start: "a" <[2]>'}
    ((tokens, reason),) = run(engine, [[5, 6, 7]], [SamplingParams(max_tokens=8, structured=spec)])
    assert reason == "stop" and tokens[-1] == 2 and len(tokens) == 2
    assert engine.take_failed() == []
