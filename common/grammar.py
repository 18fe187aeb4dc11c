"""SamplingParams.structured -> an llguidance grammar, and the llguidance tokenizer.

    {"kind": "json", "spec": schema text, "whitespace_pattern"?}  ─┐
    {"kind": "json_object", "spec": ""}                            │
    {"kind": "regex", "spec": regex}                               ├─▶ grammar_text() ─▶ llguidance
    {"kind": "choice", "spec": JSON list of strings}               │   grammar (JSON text)
    {"kind": "grammar", "spec": Lark text (llguidance's dialect)} ─┘

The tokenizer pool compiles and validates it at intake (tokenizer_worker.grammar); each
scheduler process makes the same text again from the same spec and builds one matcher per
constrained request from it (scheduler_worker.structured). Both cache by the spec, so a
schema is turned into a grammar once per process. Torch-free.

JSON without a whitespace_pattern is compact (no whitespace between tokens: a small model
left free to write whitespace can spend its whole budget on it); with one, that pattern is
what may appear between tokens. A JSON schema is bounded first (common.schema_bounds: its
objects closed, its numbers of bounded length), and json_object mode is its JSON_OBJECT.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import llguidance

if TYPE_CHECKING:
    from llguidance._lib import JsonCompileOptions

from common.model_facts import read_hf_config
from common.schema_bounds import JSON_OBJECT, SchemaBoundError, bounded_schema


class GrammarError(ValueError):
    """A spec that does not compile: the message says why (schema, regex, grammar)."""


def _json_options(whitespace_pattern: str | None) -> JsonCompileOptions:
    if whitespace_pattern is None:
        return {"whitespace_flexible": False}
    return {"whitespace_flexible": True, "whitespace_pattern": whitespace_pattern}


def grammar_text(structured: dict[str, str]) -> str:
    """The llguidance grammar for a (shape-checked) SamplingParams.structured; GrammarError
    for a spec that is not even well-formed (its grammar is checked by `check`)."""
    kind, spec = structured["kind"], structured["spec"]
    ws = structured.get("whitespace_pattern")
    if kind in ("json", "json_object"):
        if kind == "json_object":
            schema: Any = JSON_OBJECT
        else:
            try:
                schema = json.loads(spec)
            except ValueError as e:
                raise GrammarError(f"the JSON schema is not valid JSON: {e}") from None
            if not isinstance(schema, (dict, bool)):
                raise GrammarError("the JSON schema must be an object (or a boolean)")
            try:
                schema = bounded_schema(schema)
            except SchemaBoundError as e:
                raise GrammarError(f"JSON schema: {e}") from None
        try:
            return llguidance.LLMatcher.grammar_from_json_schema(
                schema, overrides=_json_options(ws)
            )
        except (ValueError, TypeError) as e:
            raise GrammarError(f"invalid JSON schema: {e}") from None
    if kind == "regex":
        return llguidance.LLMatcher.grammar_from_regex(spec)
    if kind == "choice":
        try:
            choices = json.loads(spec)
        except ValueError:
            choices = None
        if not (isinstance(choices, list) and choices and all(isinstance(c, str) for c in choices)):
            raise GrammarError("choice must be a non-empty list of strings")
        # Lark string literals take JSON's escapes
        alts = " | ".join(json.dumps(c, ensure_ascii=False) for c in dict.fromkeys(choices))
        return llguidance.LLMatcher.grammar_from_lark(f"start: {alts}\n")
    if kind == "grammar":
        return llguidance.LLMatcher.grammar_from_lark(spec)
    raise GrammarError(f"unknown structured kind {kind!r}")


def check(grammar: str, tokenizer: Callable[[], llguidance.LLTokenizer]) -> None:
    """GrammarError naming what is wrong with a grammar, else nothing. Checked without a
    tokenizer first: only a grammar that names tokens (<|special|>, <[id]>) needs one
    (llguidance warns it "can't validate" them), so `tokenizer()` is called for those
    alone (an llguidance tokenizer takes 0.5-2.6 s and 50-200 MB to build)."""
    is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar, None)
    if not is_error and any(m.startswith(_NO_TOKENIZER) for m in messages):
        is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(
            grammar, tokenizer()
        )
    if is_error:
        raise GrammarError(messages[0].strip() if messages else "invalid grammar")


_NO_TOKENIZER = "no tokenizer"  # llguidance's warning: "no tokenizer - can't validate <...>"


@lru_cache(maxsize=4)
def llg_tokenizer(model_dir: str, vocab_size: int | None = None) -> llguidance.LLTokenizer:
    """The model's tokenizer as llguidance sees it (about 0.5 s to build: once per process).
    vocab_size: the logits' width (the model's; tokenizer.json may hold fewer tokens)."""
    path = Path(model_dir)
    hf = read_hf_config(path)
    n_vocab = vocab_size or int(hf["vocab_size"])
    eos = _eos_ids(path, hf)
    return llguidance.LLTokenizer(
        (path / "tokenizer.json").read_text(), n_vocab=n_vocab, eos_token=eos[0] if eos else None
    )


def _eos_ids(path: Path, hf: dict[str, Any]) -> list[int]:
    ids: list[int] = []
    gen = path / "generation_config.json"
    sources = [hf.get("eos_token_id")]
    if gen.is_file():
        sources.insert(0, json.loads(gen.read_text()).get("eos_token_id"))
    for v in sources:
        for i in v if isinstance(v, list) else [v]:
            if isinstance(i, int) and i not in ids:
                ids.append(i)
    return ids
