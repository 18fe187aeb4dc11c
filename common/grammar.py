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
what may appear between tokens. A JSON schema's objects are closed (`closed_objects`).
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


class GrammarError(ValueError):
    """A spec that does not compile: the message says why (schema, regex, grammar)."""


def _json_options(whitespace_pattern: str | None) -> JsonCompileOptions:
    if whitespace_pattern is None:
        return {"whitespace_flexible": False}
    return {"whitespace_flexible": True, "whitespace_pattern": whitespace_pattern}


# keywords whose value is a subschema, a list of them ("items" either), or a map of names to
# them; _SAME_OBJECT's apply to the object their parent describes, so they stay open
# (closed, each would forbid the properties that the others add)
_SUBSCHEMA = {"items", "additionalProperties", "additionalItems", "unevaluatedItems"}
_SUBSCHEMA |= {"contains", "anyOf", "oneOf", "prefixItems"}
_MAP = ("properties", "patternProperties", "$defs", "definitions")
_SAME_OBJECT = ("allOf", "if", "then", "else")


SAFE_INTEGER = 2**53 - 1  # JSON's interoperable integers (RFC 8259, section 6)
_INT_BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")


def closed_objects(schema: Any, close: bool = True) -> Any:
    """A copy of a JSON schema in which an object schema that lists `properties` and says
    nothing of `additionalProperties` (nor `unevaluatedProperties`) gets
    `additionalProperties: false`, at every depth: the declared properties only, as
    xgrammar, outlines and llama.cpp read such a schema. The JSON Schema reading (any
    other property allowed) lets a small model add properties until max_tokens. An
    explicit `additionalProperties` is kept; allOf's members (and if / then / else) are
    left open, their own subschemas closed. An integer with no bound gets JSON's safe
    range (SAFE_INTEGER), so that its digits end."""
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key in _MAP and isinstance(value, dict):
            out[key] = {k: closed_objects(v) for k, v in value.items()}
        elif key in _SUBSCHEMA or key in _SAME_OBJECT:
            shut = key not in _SAME_OBJECT
            if isinstance(value, list):
                out[key] = [closed_objects(v, shut) for v in value]
            else:
                out[key] = closed_objects(value, shut)
        else:
            out[key] = value
    if (
        close
        and isinstance(schema.get("properties"), dict)
        and "additionalProperties" not in schema
        and "unevaluatedProperties" not in schema
    ):
        out["additionalProperties"] = False
    kinds = schema.get("type")
    if (kinds == "integer" or (isinstance(kinds, list) and "integer" in kinds)) and not any(
        k in schema for k in _INT_BOUNDS
    ):
        # an integer with no bound is JSON's safe range (llama.cpp caps its digits too):
        # unbounded, a small model writes digits until max_tokens
        out["minimum"], out["maximum"] = -SAFE_INTEGER, SAFE_INTEGER
    return out


def grammar_text(structured: dict[str, str]) -> str:
    """The llguidance grammar for a (shape-checked) SamplingParams.structured; GrammarError
    for a spec that is not even well-formed (its grammar is checked by `check`)."""
    kind, spec = structured["kind"], structured["spec"]
    ws = structured.get("whitespace_pattern")
    if kind in ("json", "json_object"):
        if kind == "json_object":
            schema: Any = {"type": "object"}
        else:
            try:
                schema = json.loads(spec)
            except ValueError as e:
                raise GrammarError(f"the JSON schema is not valid JSON: {e}") from None
            if not isinstance(schema, (dict, bool)):
                raise GrammarError("the JSON schema must be an object (or a boolean)")
            schema = closed_objects(schema)
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
