"""JSON schemas as common.grammar compiles them: an object that lists its properties and
says nothing of additionalProperties takes those alone (at every depth), an explicit
additionalProperties is honoured, and no whitespace goes between tokens unless the request
gave a whitespace_pattern. Checked with llguidance's matcher on the default model's
tokenizer."""

from __future__ import annotations

import json

import pytest

from common.grammar import grammar_text
from common.schema_bounds import closed_objects

llguidance = pytest.importorskip("llguidance")

CITY = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "country": {"type": "string"},
        "population": {"type": "integer"},
    },
    "required": ["name", "country", "population"],
}
PARIS = '{"name":"Paris","country":"France","population":2100000'


@pytest.fixture(scope="module")
def tokenizer(default_model_dir):
    return llguidance.LLTokenizer((default_model_dir / "tokenizer.json").read_text())


def accepts(tokenizer, schema: dict, text: str, whitespace_pattern: str | None = None) -> bool:
    spec = {"kind": "json", "spec": json.dumps(schema)}
    if whitespace_pattern is not None:
        spec["whitespace_pattern"] = whitespace_pattern
    m = llguidance.LLMatcher(tokenizer, grammar_text(spec), log_level=0)
    assert not m.is_error(), m.get_error()
    ok = m.consume_tokens(tokenizer.tokenize_str(text))
    return ok and not m.is_error() and m.is_accepting()


def test_undeclared_properties_are_refused(tokenizer):
    assert accepts(tokenizer, CITY, PARIS + "}")
    assert not accepts(tokenizer, CITY, PARIS + ',"capital":"Paris"}')
    # said explicitly, it is honoured
    assert accepts(tokenizer, {**CITY, "additionalProperties": True}, PARIS + ',"capital":"x"}')
    extra_ints = {**CITY, "additionalProperties": {"type": "integer"}}
    assert accepts(tokenizer, extra_ints, PARIS + ',"rank":1}')
    assert not accepts(tokenizer, extra_ints, PARIS + ',"rank":"x"}')
    # an object without properties stays open (json_object, a free-form map)
    assert accepts(tokenizer, {"type": "object"}, '{"any":1}')


def test_an_unbounded_integer_ends_within_json_s_safe_range(tokenizer):
    """ "Describe Paris as JSON." on the default model wrote population digits until
    max_tokens once extra properties were refused: an integer with no bound has 15 digits."""
    assert accepts(tokenizer, CITY, PARIS + "}")
    assert accepts(tokenizer, CITY, PARIS[: PARIS.rindex(":") + 1] + "9" * 15 + "}")
    assert not accepts(tokenizer, CITY, PARIS[: PARIS.rindex(":") + 1] + "1" + "0" * 15 + "}")
    # a side of its own is kept as written; the open side is capped all the same
    assert closed_objects({"type": "integer", "minimum": 0}) == {
        "type": "integer",
        "minimum": 0,
        "maximum": 10**15 - 1,
    }
    assert not accepts(tokenizer, {"type": "integer", "minimum": 0}, "1" + "0" * 20)
    assert not accepts(tokenizer, {"type": "integer", "minimum": 0}, "-1")


def test_nested_objects_are_closed_too(tokenizer):
    country = {"type": "object", "properties": {"code": {"type": "string"}}}
    schema = {
        "type": "object",
        "properties": {
            "cities": {"type": "array", "items": CITY},
            "country": {"$ref": "#/$defs/C"},
        },
        "$defs": {"C": country},
    }
    assert accepts(tokenizer, schema, '{"cities":[' + PARIS + '}],"country":{"code":"FR"}}')
    assert not accepts(tokenizer, schema, '{"cities":[' + PARIS + ',"x":1}]}')
    assert not accepts(tokenizer, schema, '{"country":{"code":"FR","x":1}}')
    union = {"anyOf": [CITY, {"type": "object", "properties": {"id": {"type": "integer"}}}]}
    assert accepts(tokenizer, union, '{"id":1}')
    assert not accepts(tokenizer, union, '{"id":1,"x":1}')


def test_all_of_members_stay_open_so_they_combine():
    a = {"type": "object", "properties": {"a": {"type": "string"}}}
    b = {"properties": {"b": {"type": "object", "properties": {"c": {"type": "string"}}}}}
    got = closed_objects({"allOf": [a, b]})
    assert got["allOf"][0] == a  # closed, it would forbid b
    assert got["allOf"][1]["properties"]["b"]["additionalProperties"] is False
    assert "additionalProperties" not in got
    # property names and values that merely look like keywords are left alone
    odd = {"type": "object", "properties": {"items": {"const": {"properties": {}}}}}
    assert closed_objects(odd)["properties"]["items"] == {"const": {"properties": {}}}
    assert closed_objects(True) is True


def test_whitespace_only_where_a_pattern_allows_it(tokenizer):
    assert not accepts(tokenizer, CITY, PARIS.replace(",", ", ") + "}")
    assert not accepts(tokenizer, CITY, "{\n  " + PARIS[1:] + "\n}")
    assert not accepts(tokenizer, CITY, PARIS + "}\n")
    # the request's whitespace_pattern lets it back, and bounds it
    assert accepts(tokenizer, CITY, PARIS.replace(",", ", ") + "}", whitespace_pattern=" ?")
    assert not accepts(tokenizer, CITY, PARIS.replace(",", ",  ") + "}", whitespace_pattern=" ?")
