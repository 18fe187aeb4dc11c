"""The grammars that force tool calls (ToolFormat.grammar, common/tool_formats/), checked with llguidance's
own matcher on the default model's tokenizer: they compile, accept calls whose arguments
validate against the function's schema in the parser's format, and reject the rest; what
they accept, the parser reads back as the same call."""

from __future__ import annotations

import json

import jsonschema
import pytest

from common.tool_formats import tool_format
from frontend.tools.request import ToolRequest, tool_request


def tool_grammar(tools: ToolRequest | None, name: str) -> str:
    """The grammar a forced call of `tools` gets in format `name` (frontend.tools.request.apply_tools)."""
    assert tools is not None
    return tool_format(name).grammar(tools.allowed, tools.repeat)


llguidance = pytest.importorskip("llguidance")

WEATHER = {
    "name": "get_weather",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
        "required": ["city"],
        "additionalProperties": False,
    },
}
ADD = {
    "name": "add",
    "parameters": {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "required": ["a", "b"],
        "additionalProperties": False,
    },
}
TOOLS = [{"type": "function", "function": f} for f in (WEATHER, ADD)]
SCHEMAS = {"get_weather": WEATHER["parameters"], "add": ADD["parameters"]}


@pytest.fixture(scope="module")
def tokenizer(default_model_dir):
    text = (default_model_dir / "tokenizer.json").read_text()
    return llguidance.LLTokenizer(text)


def accepts(tokenizer, grammar: str, text: str) -> bool:
    m = llguidance.LLMatcher(tokenizer, grammar, log_level=0)
    assert not m.is_error(), m.get_error()
    ok = m.consume_tokens(tokenizer.tokenize_str(text))
    return ok and not m.is_error() and m.is_accepting()


def hermes(name: str, args: str) -> str:
    return f'<tool_call>\n{{"name": "{name}", "arguments": {args}}}\n</tool_call>'


SAMPLES = {  # parser -> (one valid weather call, two valid calls in parallel)
    "hermes": (
        hermes("get_weather", '{"city": "Paris"}'),
        hermes("get_weather", '{"city": "Oslo", "unit": "c"}')
        + "\n"
        + hermes("add", '{"a": 1, "b": 2}'),
    ),
    "llama3_json": (
        '{"name": "get_weather", "parameters": {"city": "Paris"}}',
        '{"name": "get_weather", "parameters": {"city": "Oslo"}}; {"name": "add", "parameters": {"a": 1, "b": 2}}',
    ),
    "mistral": (
        '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}]',
        '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Oslo"}}, {"name": "add", "arguments": {"a": 1, "b": 2}}]',
    ),
    "pythonic": (
        '[get_weather(city="Paris", )]',
        '[get_weather(city="Oslo", unit="c", ), add(a=1, b=2, )]',
    ),
}


def _valid(parser: str, text: str) -> None:
    parsed = tool_format(parser).parse(text)
    assert parsed.calls
    for c in parsed.calls:
        jsonschema.validate(json.loads(c.arguments), SCHEMAS[c.name])


@pytest.mark.parametrize("parser", sorted(SAMPLES))
def test_required_accepts_valid_calls(tokenizer, parser):
    one, two = SAMPLES[parser]
    grammar = tool_grammar(tool_request(TOOLS, "required", None), parser)
    assert accepts(tokenizer, grammar, one) and accepts(tokenizer, grammar, two)
    _valid(parser, one)
    _valid(parser, two)
    single = tool_grammar(tool_request(TOOLS, "required", False), parser)
    assert accepts(tokenizer, single, one)
    assert not accepts(tokenizer, single, two)  # parallel_tool_calls false: one call


ADD_ONLY = {
    "hermes": hermes("add", '{"a": 1, "b": 2}'),
    "llama3_json": '{"name": "add", "parameters": {"a": 1, "b": 2}}',
    "mistral": '[TOOL_CALLS] [{"name": "add", "arguments": {"a": 1, "b": 2}}]',
    "pythonic": "[add(a=1, b=2, )]",
}


@pytest.mark.parametrize("parser", sorted(SAMPLES))
def test_named_choice_accepts_only_that_function(tokenizer, parser):
    named = {"type": "function", "function": {"name": "add"}}
    grammar = tool_grammar(tool_request(TOOLS, named, None), parser)
    assert accepts(tokenizer, grammar, ADD_ONLY[parser])
    _valid(parser, ADD_ONLY[parser])
    assert not accepts(tokenizer, grammar, SAMPLES[parser][0])  # get_weather: not named
    assert not accepts(tokenizer, grammar, SAMPLES[parser][1])


def test_named_choice_is_one_call(tokenizer):
    """Free to repeat the named call, the default model wrote it again until max_tokens;
    "required" keeps parallel calls (parallel_tool_calls, default true)."""
    twice = hermes("add", '{"a": 1, "b": 2}') + "\n" + hermes("add", '{"a": 3, "b": 4}')
    named = {"type": "function", "function": {"name": "add"}}
    assert not accepts(tokenizer, tool_grammar(tool_request(TOOLS, named, True), "hermes"), twice)
    assert accepts(tokenizer, tool_grammar(tool_request(TOOLS, "required", True), "hermes"), twice)


@pytest.mark.parametrize(
    "text",
    [
        hermes("get_weather", '{"unit": "c"}'),  # the required city missing
        hermes("get_weather", '{"city": 5}'),  # wrong type
        hermes("get_weather", '{"city": "Paris", "unit": "k"}'),  # not in the enum
        hermes("get_weather", '{"city": "Paris", "extra": 1}'),  # additionalProperties
        hermes("get_time", "{}"),  # no such tool
        "Sure! " + hermes("get_weather", '{"city": "Paris"}'),  # text before the call
        '{"name": "get_weather", "arguments": {"city": "Paris"}}',  # no tags
    ],
)
def test_required_rejects_invalid_calls(tokenizer, text):
    grammar = tool_grammar(tool_request(TOOLS, "required", None), "hermes")
    assert not accepts(tokenizer, grammar, text)
    with pytest.raises(jsonschema.ValidationError):  # the oracle agrees where it applies
        parsed = tool_format("hermes").parse(text)
        if not parsed.calls or parsed.calls[0].name not in SCHEMAS or parsed.content:
            raise jsonschema.ValidationError("not a lone call of a known tool")
        jsonschema.validate(json.loads(parsed.calls[0].arguments), SCHEMAS[parsed.calls[0].name])


def test_pythonic_rejects_missing_required(tokenizer):
    grammar = tool_grammar(tool_request(TOOLS, "required", None), "pythonic")
    assert not accepts(tokenizer, grammar, "[add(a=1, )]")
    assert not accepts(tokenizer, grammar, "[get_weather(city=1, )]")


def test_grammar_escapes_names_and_schemas(tokenizer):
    """Names with dots and dashes, descriptions and strings with quotes compile."""
    fn = {
        "name": "ns.tool-1",
        "parameters": {
            "type": "object",
            "properties": {"q": {"type": "string", "pattern": '^"[a-z]+"$'}},
            "required": ["q"],
        },
    }
    grammar = tool_grammar(
        tool_request([{"type": "function", "function": fn}], "required", None), "hermes"
    )
    assert accepts(tokenizer, grammar, hermes("ns.tool-1", '{"q": "\\"abc\\""}'))
    assert not accepts(tokenizer, grammar, hermes("ns.tool-1", '{"q": "abc"}'))


def test_arguments_are_closed_and_written_as_json_dumps(tokenizer):
    """A schema that says nothing of additionalProperties gets its properties alone (at
    every depth), and the arguments' whitespace is json.dumps's (", " and ": ") alone."""
    fn = {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "where": {"type": "object", "properties": {"lat": {"type": "number"}}},
            },
            "required": ["city"],
        },
    }
    grammar = tool_grammar(
        tool_request([{"type": "function", "function": fn}], "required", None), "hermes"
    )
    for parser in ("llama3_json", "mistral", "pythonic"):  # every format's grammar compiles
        tool_grammar(tool_request([{"type": "function", "function": fn}], "required", None), parser)
    call = lambda args: hermes("get_weather", args)  # noqa: E731
    assert accepts(tokenizer, grammar, call('{"city": "Paris", "where": {"lat": 48.9}}'))
    assert not accepts(tokenizer, grammar, call('{"city": "Paris", "required": ["city"]}'))
    assert not accepts(tokenizer, grammar, call('{"city": "Paris", "where": {"lat": 1, "x": 2}}'))
    assert not accepts(tokenizer, grammar, call('{\n  "city": "Paris"\n}'))
    assert not accepts(tokenizer, grammar, call('{"city":  "Paris"}'))
    assert not accepts(tokenizer, grammar, call('{"city":"Paris"}'))
