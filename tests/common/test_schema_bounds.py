"""The bounds common.schema_bounds puts on what a JSON schema leaves open (issue 55): a
number's digits, an integer's, json_object's numbers; a schema's own bounds kept; no
schema made unsatisfiable; a bound no grammar takes refused naming it; the lift. Checked
with llguidance's matcher on the default model's tokenizer, through common.grammar (the
path every response_format / text.format / structured_outputs.json takes) and the forced
tool call's grammar."""

from __future__ import annotations

import json
import re

import pytest

from common.grammar import GrammarError, grammar_text
from common.schema_bounds import bounded_schema, closed_objects
from common.tool_formats import tool_format

llguidance = pytest.importorskip("llguidance")

CITY = {  # the issue's schema: no additionalProperties, a number
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "country": {"type": "string"},
        "population_millions": {"type": "number"},
    },
    "required": ["name", "country", "population_millions"],
}
OSLO = '{"name":"Oslo","country":"Norway","population_millions":'


@pytest.fixture(scope="module")
def tokenizer(default_model_dir):
    return llguidance.LLTokenizer((default_model_dir / "tokenizer.json").read_text())


def matches(tokenizer, grammar: str, text: str) -> bool:
    m = llguidance.LLMatcher(tokenizer, grammar, log_level=0)
    assert not m.is_error(), m.get_error()
    ok = m.consume_tokens(tokenizer.tokenize_str(text))
    return ok and not m.is_error() and m.is_accepting()


def accepts(tokenizer, schema, text: str) -> bool:
    spec = {"kind": "json", "spec": json.dumps(schema)}
    return matches(tokenizer, grammar_text(spec), text)


def test_a_number_has_16_integral_digits_and_10_decimals(tokenizer):
    for ok in ("0.66", "1200000000000000", "-9999999999999999.0123456789", "0.0000000001", "7"):
        assert accepts(tokenizer, CITY, OSLO + ok + "}"), ok
    # the issue's loop: 17 digits and more, 11 decimals and more, are not JSON this writes
    for bad in ("1" + "0" * 16, "1200000000000000000000", "0.12345678901", "1.00000000000"):
        assert not accepts(tokenizer, CITY, OSLO + bad + "}"), bad
    assert not accepts(tokenizer, CITY, OSLO + "1e5}")  # a bounded number has no exponent
    # a type list with number is bounded too; its other types are untouched
    nullable = {"type": ["number", "null"]}
    assert accepts(tokenizer, nullable, "null") and accepts(tokenizer, nullable, "2.5")
    assert not accepts(tokenizer, nullable, "1" * 17)


def test_the_schema_s_own_bounds_are_kept(tokenizer):
    # a side it states stays as written; the other is capped
    assert bounded_schema({"type": "number", "minimum": 0.5}) == {
        "type": "number",
        "minimum": 0.5,
        "exclusiveMaximum": 1e16,
        "multipleOf": 1e-10,
    }
    assert not accepts(tokenizer, {"type": "number", "minimum": 0.5}, "0.4")
    # its multipleOf replaces the 10 decimals
    halves = {"type": "number", "multipleOf": 0.5}
    assert accepts(tokenizer, halves, "2.5") and not accepts(tokenizer, halves, "2.25")
    assert not accepts(tokenizer, halves, "1" * 17)
    wide = {"type": "number", "minimum": -1e17, "maximum": 1e17}
    assert accepts(tokenizer, wide, "1" * 17) and not accepts(tokenizer, wide, "1" * 18)


def test_a_bound_never_makes_a_schema_unsatisfiable(tokenizer):
    # a side past the cap: the other side gets 1e18 instead of 1e16, both still written
    big = {"type": "number", "minimum": 1e17}
    assert accepts(tokenizer, big, "1" + "0" * 17) and not accepts(tokenizer, big, "1" + "0" * 18)
    small = {"type": "integer", "maximum": -1e16}
    assert accepts(tokenizer, small, "-1" + "0" * 16)
    assert not accepts(tokenizer, small, "-2" + "0" * 18)
    # a range narrower than 1e-10 holds no 10-decimal value: no multipleOf, still served
    tiny = {"type": "number", "exclusiveMinimum": 0, "maximum": 1e-11}
    assert "multipleOf" not in bounded_schema(tiny)
    assert accepts(tokenizer, tiny, "0.000000000001")
    assert "multipleOf" in bounded_schema({"type": "number", "minimum": 0, "maximum": 1e-10})
    # an enum (or const) is finite already: its values are kept whatever their digits
    exact = {"type": "number", "enum": [0.12345678901234, 1e17]}
    assert bounded_schema(exact) == exact and accepts(tokenizer, exact, "0.12345678901234")


@pytest.mark.parametrize(
    "schema, named",
    [
        ({"type": "number", "minimum": 1e30}, "minimum 1e+30 is beyond"),
        (
            {"type": "object", "properties": {"p": {"type": "integer", "exclusiveMaximum": -1e19}}},
            "exclusiveMaximum -1e+19 at /properties/p is beyond",
        ),
        ({"type": "number", "x-zeroserve": {"number_bound": False}}, "x-zeroserve: takes"),
    ],
)
def test_a_bound_no_grammar_takes_is_refused_naming_it(schema, named):
    with pytest.raises(GrammarError, match=re.escape(named)):
        grammar_text({"kind": "json", "spec": json.dumps(schema)})


def test_json_object_bounds_numbers_at_every_depth(tokenizer):
    g = grammar_text({"kind": "json_object", "spec": ""})
    assert matches(tokenizer, g, '{"a":[1,-2.5,{"b":null,"c":true}],"d":"x","e":{}}')
    assert matches(tokenizer, g, "{}")
    assert not matches(tokenizer, g, "[1]")  # an object, as before
    for bad in ("1" * 17, "0.12345678901"):
        assert not matches(tokenizer, g, '{"a":' + bad + "}")
        assert not matches(tokenizer, g, '{"a":[{"b":[' + bad + "]}]}")


def test_x_zeroserve_lifts_the_number_bounds(tokenizer):
    free = {**CITY, "x-zeroserve": {"number_bounds": False}}
    assert accepts(tokenizer, free, OSLO + "1" * 30 + ".5e7}")
    assert "x-zeroserve" not in bounded_schema(free)
    assert bounded_schema(free)["additionalProperties"] is False  # objects stay closed
    # numbers only: closed_objects without them leaves a number as written
    assert closed_objects({"type": "number"}, numbers=False) == {"type": "number"}


def test_forced_tool_call_arguments_are_bounded(tokenizer):
    fn = {"name": "city", "parameters": CITY}
    for parser, call in (
        ("hermes", '<tool_call>\n{"name": "city", "arguments": ARGS}\n</tool_call>'),
        ("llama3_json", '{"name": "city", "parameters": ARGS}'),
    ):
        grammar = tool_format(parser).grammar([fn], repeat=True)
        # (the tool grammar writes a schema's keys sorted: its properties in that order)
        args = '{"country": "Norway", "name": "Oslo", "population_millions": '
        assert matches(tokenizer, grammar, call.replace("ARGS", args + "0.7}"))
        assert not matches(tokenizer, grammar, call.replace("ARGS", args + "1" * 17 + "}"))
    pythonic = tool_format("pythonic").grammar([fn], repeat=True)
    head = '[city(name="Oslo", country="Norway", population_millions='  # as listed
    assert matches(tokenizer, pythonic, head + "0.7, )]")
    assert not matches(tokenizer, pythonic, head + "1" * 17 + ", )]")
    lifted = {"name": "city", "parameters": {**CITY, "x-zeroserve": {"number_bounds": False}}}
    grammar = tool_format("pythonic").grammar([lifted], repeat=True)
    assert matches(tokenizer, grammar, head + "1" * 17 + ", )]")
