"""frontend.structured: response_format and structured_outputs -> SamplingParams.structured,
and the 400s for malformed ones (the spec itself is compiled by the tokenizer pool)."""

from __future__ import annotations

import json

import pytest

from common.sampling_params import SamplingParams
from frontend.api.openai_protocol import ChatCompletionRequest, CompletionRequest, GenerateRequest
from frontend.errors import APIError
from frontend.structured import structured_alias, structured_from_request

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}}
MSGS = [{"role": "user", "content": "Hi"}]


def chat(**kw) -> ChatCompletionRequest:
    return ChatCompletionRequest(messages=MSGS, **kw)


@pytest.mark.parametrize(
    "kw, want",
    [
        ({}, None),
        ({"response_format": {"type": "text"}}, None),
        ({"response_format": {"type": "json_object"}}, {"kind": "json_object", "spec": ""}),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": SCHEMA, "strict": True},
                }
            },
            {"kind": "json", "spec": json.dumps(SCHEMA)},
        ),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
            {"kind": "json_object", "spec": ""},
        ),
        ({"structured_outputs": {"json": SCHEMA}}, {"kind": "json", "spec": json.dumps(SCHEMA)}),
        ({"structured_outputs": {"json": "{}"}}, {"kind": "json", "spec": "{}"}),
        (
            {"structured_outputs": {"json": SCHEMA, "whitespace_pattern": " ?"}},
            {"kind": "json", "spec": json.dumps(SCHEMA), "whitespace_pattern": " ?"},
        ),
        ({"structured_outputs": {"regex": "a+"}}, {"kind": "regex", "spec": "a+"}),
        ({"structured_outputs": {"choice": ["x", "y"]}}, {"kind": "choice", "spec": '["x", "y"]'}),
        (
            {"structured_outputs": {"grammar": 'start: "a"'}},
            {"kind": "grammar", "spec": 'start: "a"'},
        ),
        ({"structured_outputs": {"json_object": True}}, {"kind": "json_object", "spec": ""}),
        ({"structured_outputs": {}}, None),
        (  # a text response_format asks for nothing, so it may go with structured_outputs
            {"response_format": {"type": "text"}, "structured_outputs": {"regex": "a"}},
            {"kind": "regex", "spec": "a"},
        ),
    ],
)
def test_mapping(kw, want):
    got = structured_from_request(chat(**kw))
    assert got == want
    if got is not None:  # the wire field's own check accepts it
        SamplingParams(structured=got).validate()


def test_every_endpoint_has_both_fields():
    so = {"structured_outputs": {"regex": "a"}}
    for req in (
        CompletionRequest(prompt="Hi", **so),
        GenerateRequest(prompt="Hi", **so),
        CompletionRequest(prompt="Hi", response_format={"type": "json_object"}),
    ):
        assert structured_from_request(req) is not None


@pytest.mark.parametrize(
    "kw, param",
    [
        ({"response_format": {"type": "xml"}}, "response_format.type"),
        ({"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"schema": SCHEMA}}},
            "response_format.json_schema.name",
        ),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": 3}}},
            "response_format.json_schema.schema",
        ),
        ({"response_format": {"type": "json_object", "x": 1}}, "response_format.x"),
        (
            {"response_format": {"type": "json_object"}, "structured_outputs": {"regex": "a"}},
            "structured_outputs",
        ),
        ({"structured_outputs": {"regex": "a", "choice": ["b"]}}, "structured_outputs"),
        ({"structured_outputs": {"backend": "xgrammar"}}, "structured_outputs.backend"),
        ({"structured_outputs": {"choice": []}}, "structured_outputs.choice"),
        ({"structured_outputs": {"choice": [1]}}, "structured_outputs.choice"),
        ({"structured_outputs": {"regex": ""}}, "structured_outputs.regex"),
        ({"structured_outputs": {"json": 5}}, "structured_outputs.json"),
        ({"structured_outputs": {"json_object": "yes"}}, "structured_outputs.json_object"),
        (
            {"structured_outputs": {"regex": "a", "whitespace_pattern": " "}},
            "structured_outputs.whitespace_pattern",
        ),
        (
            {"structured_outputs": {"whitespace_pattern": " "}},
            "structured_outputs.whitespace_pattern",
        ),
    ],
)
def test_malformed_is_400_naming_the_field(kw, param):
    with pytest.raises(APIError) as e:
        structured_from_request(chat(**kw))
    assert e.value.status == 400 and e.value.param == param


def test_alias_names_the_field_the_client_sent():
    assert structured_alias(chat(structured_outputs={"regex": "a"})) == {
        "structured": "structured_outputs.regex"
    }
    assert structured_alias(chat(response_format={"type": "json_object"})) == {
        "structured": "response_format"
    }
