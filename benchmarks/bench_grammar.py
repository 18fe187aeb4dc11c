"""Grammar libraries compared on the default model's 49,152-token vocabulary (issue 22).

    PYTHONPATH=$PWD .venv/bin/python benchmarks/bench_grammar.py [--bounds]

llguidance (a runtime dependency) always; xgrammar and outlines-core when importable (they
are not dependencies: `pip install --no-deps --target /tmp/benchlibs xgrammar
apache-tvm-ffi outlines-core` and put /tmp/benchlibs on PYTHONPATH). For each library:
tokenizer setup, compile time per real schema (first compile, no cache), and the time
to compute one token mask, walking a valid instance of each schema token by token (the
mask before each token, the token then consumed; median and p99 over all steps).

--bounds: llguidance alone, the schemas as written against the same schemas as the server
compiles them (common.schema_bounds: closed objects, bounded numbers; json_object as
JSON_OBJECT), alternated over 5 rounds in one process: what the bounds cost a mask.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import json
import platform
import statistics
import time
from collections.abc import Callable
from typing import Any

from common.model_files.model_source import resolve_model

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer", "minimum": 0},
        "email": {"type": "string"},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 5},
    },
    "required": ["name", "age", "email", "tags"],
    "additionalProperties": False,
}
ORDER = {
    "type": "object",
    "properties": {
        "order_id": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{6}$"},
        "status": {"enum": ["pending", "shipped", "delivered", "cancelled"]},
        "customer": {
            "type": "object",
            "properties": {
                "id": {"type": "integer"},
                "name": {"type": "string"},
                "vip": {"type": "boolean"},
            },
            "required": ["id", "name", "vip"],
            "additionalProperties": False,
        },
        "items": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "sku": {"type": "string"},
                    "quantity": {"type": "integer", "minimum": 1},
                    "price": {"type": "number"},
                },
                "required": ["sku", "quantity", "price"],
                "additionalProperties": False,
            },
            "minItems": 1,
        },
        "note": {"anyOf": [{"type": "string"}, {"type": "null"}]},
    },
    "required": ["order_id", "status", "customer", "items", "note"],
    "additionalProperties": False,
}
TOOL_CALL = {  # a function call's arguments, as tool calling constrains them
    "type": "object",
    "properties": {
        "location": {"type": "string", "description": "city and country"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 14},
    },
    "required": ["location", "unit", "days"],
    "additionalProperties": False,
}
SCHEMAS: dict[str, tuple[dict[str, Any], Any]] = {
    "person": (
        PERSON,
        {"name": "Ada Lovelace", "age": 36, "email": "ada@example.org", "tags": ["math", "poet"]},
    ),
    "order": (
        ORDER,
        {
            "order_id": "ABC-123456",
            "status": "shipped",
            "customer": {"id": 42, "name": "Grace Hopper", "vip": True},
            "items": [
                {"sku": "KB-01", "quantity": 2, "price": 19.99},
                {"sku": "MS-07", "quantity": 1, "price": 9.5},
            ],
            "note": None,
        },
    ),
    "tool_call": (TOOL_CALL, {"location": "Paris, France", "unit": "celsius", "days": 3}),
    "json_object": ({"type": "object"}, {"answer": [1, 2, {"nested": "yes"}], "ok": True}),
}


def timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def summary(us: list[float]) -> str:
    us = sorted(us)
    p99 = us[min(len(us) - 1, int(len(us) * 0.99))]
    return (
        f"median {statistics.median(us):6.1f} us  mean {statistics.fmean(us):6.1f} us  "
        f"p99 {p99:7.1f} us  max {us[-1]:7.1f} us  ({len(us)} steps)"
    )


def bench_llguidance(model_dir: Path, eos: int, vocab: int) -> None:
    import llguidance
    import llguidance.torch as llt

    tok_json = (model_dir / "tokenizer.json").read_text()
    tok, t = timed(lambda: llguidance.LLTokenizer(tok_json, n_vocab=vocab, eos_token=eos))
    print(f"llguidance {llguidance.__version__}: tokenizer {t * 1e3:.0f} ms")
    mask = llt.allocate_token_bitmask(1, vocab)
    steps: list[float] = []
    for name, (schema, instance) in SCHEMAS.items():
        grammar = llguidance.LLMatcher.grammar_from_json_schema(
            json.dumps(schema), defaults={"whitespace_flexible": False}
        )
        m, t = timed(lambda g=grammar: llguidance.LLMatcher(tok, g))
        assert not m.is_error(), m.get_error()
        ids = tok.tokenize_str(json.dumps(instance, separators=(",", ":")))
        for i in ids:
            _, dt = timed(lambda m=m: llt.fill_next_token_bitmask(m, mask))
            steps.append(dt * 1e6)
            assert m.consume_token(i), (name, m.get_error())
        print(f"  compile {name:12s} {t * 1e3:7.2f} ms  ({len(ids)} tokens walked)")
    for label, g in (
        ("regex", llguidance.LLMatcher.grammar_from_regex(r"\d{3}-\d{4}")),
        ("choice", llguidance.LLMatcher.grammar_from_lark('start: "red" | "green" | "blue"')),
        (
            "lark",
            llguidance.LLMatcher.grammar_from_lark(
                'start: call\ncall: NAME "(" args ")"\nargs: NUMBER ("," NUMBER)*\n'
                "NAME: /[a-z_]+/\nNUMBER: /[0-9]+/\n"
            ),
        ),
    ):
        m, t = timed(lambda g=g: llguidance.LLMatcher(tok, g))
        print(f"  compile {label:12s} {t * 1e3:7.2f} ms  error={m.get_error() or None}")
    print(f"  mask      {summary(steps)}")


def walk_masks(tok: Any, schema: Any, instance: Any, mask: Any) -> list[float]:
    """Microseconds per mask, walking `instance` token by token under `schema`."""
    import llguidance
    import llguidance.torch as llt

    grammar = llguidance.LLMatcher.grammar_from_json_schema(
        json.dumps(schema), defaults={"whitespace_flexible": False}
    )
    m = llguidance.LLMatcher(tok, grammar)
    assert not m.is_error(), m.get_error()
    steps = []
    for i in tok.tokenize_str(json.dumps(instance, separators=(",", ":"))):
        _, dt = timed(lambda m=m: llt.fill_next_token_bitmask(m, mask))
        steps.append(dt * 1e6)
        assert m.consume_token(i), m.get_error()
    return steps


def bench_bounds(model_dir: Path, eos: int, vocab: int, rounds: int = 5) -> None:
    import llguidance
    import llguidance.torch as llt

    from common.schema_bounds import JSON_OBJECT, bounded_schema

    tok = llguidance.LLTokenizer(
        (model_dir / "tokenizer.json").read_text(), n_vocab=vocab, eos_token=eos
    )
    mask = llt.allocate_token_bitmask(1, vocab)
    served = {
        n: (JSON_OBJECT if s == {"type": "object"} else bounded_schema(s), i)
        for n, (s, i) in SCHEMAS.items()
    }
    runs: dict[str, list[list[float]]] = {"as written": [], "as served": []}
    for r in range(rounds):
        for label, schemas in (("as written", SCHEMAS), ("as served", served)):
            steps = [t for s, i in schemas.values() for t in walk_masks(tok, s, i, mask)]
            runs[label].append(steps)
            print(f"round {r + 1} {label:10s} {summary(steps)}")
    # each step's best of the rounds: what a mask costs, the machine's noise left out
    best = {k: [min(t) for t in zip(*v, strict=True)] for k, v in runs.items()}
    written, served_us = sum(best["as written"]), sum(best["as served"])
    print(
        f"best of {rounds} rounds per step, all schemas walked: as written {written:.0f} us, "
        f"as served {served_us:.0f} us ({served_us / written:.3f}x)"
    )


def bench_xgrammar(model_dir: Path, eos: int, vocab: int) -> None:
    import torch
    import xgrammar as xgr
    from transformers import PreTrainedTokenizerFast

    hf = PreTrainedTokenizerFast(tokenizer_file=str(model_dir / "tokenizer.json"))
    info, t = timed(
        lambda: xgr.TokenizerInfo.from_huggingface(hf, vocab_size=vocab, stop_token_ids=[eos])
    )
    print(f"xgrammar: tokenizer {t * 1e3:.0f} ms")
    compiler = xgr.GrammarCompiler(info, cache_enabled=False)
    mask = xgr.allocate_token_bitmask(1, vocab)
    steps: list[float] = []
    for name, (schema, instance) in SCHEMAS.items():
        cg, t = timed(
            lambda s=schema: (
                compiler.compile_json_schema(
                    json.dumps(s), any_whitespace=False, separators=(",", ":")
                )
                if s != {"type": "object"}  # strict mode would forbid any property
                else compiler.compile_builtin_json_grammar()
            )
        )
        m = xgr.GrammarMatcher(cg)
        ids = hf.encode(json.dumps(instance, separators=(",", ":")), add_special_tokens=False)
        for i in ids:
            _, dt = timed(lambda m=m: m.fill_next_token_bitmask(mask))
            steps.append(dt * 1e6)
            assert m.accept_token(i), name
        print(f"  compile {name:12s} {t * 1e3:7.2f} ms  ({len(ids)} tokens walked)")
    for label, fn in (
        ("regex", lambda: compiler.compile_regex(r"\d{3}-\d{4}")),
        ("ebnf", lambda: compiler.compile_grammar('root ::= "red" | "green" | "blue"')),
    ):
        _, t = timed(fn)
        print(f"  compile {label:12s} {t * 1e3:7.2f} ms")
    print(f"  mask      {summary(steps)}")
    del torch


def _byte_decoder() -> dict[str, int]:
    """GPT-2 byte-level: the printable character each byte is written as, inverted."""
    bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs, strict=True)}


def bench_outlines(model_dir: Path, eos: int, vocab: int) -> None:
    import outlines_core as oc
    import torch
    from outlines_core.json_schema import build_regex_from_schema
    from tokenizers import Tokenizer

    hf = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    dec = _byte_decoder()
    special = {t.content for t in hf.get_added_tokens_decoder().values()}
    tokens: dict[bytes, list[int]] = {}
    for s, i in hf.get_vocab().items():
        if i != eos and s not in special:
            tokens.setdefault(bytes(dec[c] for c in s), []).append(i)
    v, t = timed(lambda: oc.Vocabulary(eos, tokens))
    print(f"outlines-core: vocabulary {t * 1e3:.0f} ms")
    mask = torch.zeros((vocab + 31) // 32, dtype=torch.int32)
    steps: list[float] = []
    for name, (schema, instance) in SCHEMAS.items():
        if name == "json_object":
            continue  # outlines' regex route needs a bounded schema
        regex = build_regex_from_schema(json.dumps(schema))
        idx, t = timed(lambda r=regex: oc.Index(r, v))
        g = oc.Guide(idx)
        ids = hf.encode(json.dumps(instance, separators=(",", ":")), add_special_tokens=False).ids
        for i in ids:
            _, dt = timed(lambda g=g: g.write_mask_into(mask.data_ptr(), mask.numel(), 4))
            steps.append(dt * 1e6)
            g.advance(i)
        print(f"  compile {name:12s} {t * 1e3:7.2f} ms  ({len(ids)} tokens walked)")
    print(f"  mask      {summary(steps)}  (no json_object, Lark, or whitespace_pattern)")


def main() -> None:
    model_dir = resolve_model("smollm2")
    cfg = json.loads((model_dir / "config.json").read_text())
    eos, vocab = int(cfg["eos_token_id"]), int(cfg["vocab_size"])
    print(
        f"model {model_dir.name}: vocab {vocab}, CPU {platform.processor() or platform.machine()}"
    )
    if "--bounds" in sys.argv[1:]:
        bench_bounds(model_dir, eos, vocab)
        return
    for fn in (bench_llguidance, bench_xgrammar, bench_outlines):
        try:
            fn(model_dir, eos, vocab)
        except ImportError as e:
            print(f"{fn.__name__[6:]}: not installed ({e.name})")
        except Exception as e:  # a library that cannot run this case still reports the rest
            print(f"{fn.__name__[6:]}: failed: {type(e).__name__}: {e}")


if __name__ == "__main__":
    main()
