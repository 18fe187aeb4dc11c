"""Tool-call parsers on sample texts of each family, whole and streamed: fed in pieces
(character by character and in random chunks), the deltas a client assembles must give
the same content and calls as parsing the whole text."""

from __future__ import annotations

import json
import random

import pytest

from common.tool_formats import FORMATS, tool_format
from frontend.tools.stream import ToolStream

W = '{"city": "Paris", "unit": "c"}'
CASES = {
    "hermes": [
        (
            f'Let me check.\n<tool_call>\n{{"name": "get_weather", "arguments": {W}}}\n</tool_call>',
            "Let me check.",
            [("get_weather", W)],
        ),
        (
            '<tool_call>{"arguments": {"a": [1, "}"]}, "name": "f"}</tool_call>\n'
            '<tool_call>\n{"name": "g", "parameters": {}}\n</tool_call>',
            None,
            [("f", '{"a": [1, "}"]}'), ("g", "{}")],
        ),
        ('<tool_call>\n{"name": "h"}\n</tool_call>', None, [("h", "{}")]),
        ("no call here, just <tool text", "no call here, just <tool text", []),
        (
            '<tool_call>\n{"name": "f", "arguments": {"a": 1',
            '<tool_call>\n{"name": "f", "arguments": {"a": 1',
            [],
        ),
        ("<tool_call>not json</tool_call>", "<tool_call>not json</tool_call>", []),
    ],
    "llama3_json": [
        ('{"name": "get_weather", "parameters": ' + W + "}", None, [("get_weather", W)]),
        (
            '<|python_tag|>{"name": "f", "parameters": {"x": "a;b"}}; {"name": "g", "parameters": {}}',
            None,
            [("f", '{"x": "a;b"}'), ("g", "{}")],
        ),
        ("The answer is {not a call}", "The answer is {not a call}", []),
        ("{just braces}", "{just braces}", []),
    ],
    "mistral": [
        (
            'Sure [TOOL_CALLS] [{"name": "get_weather", "arguments": '
            + W
            + '}, {"name": "g", "arguments": {}}]',
            "Sure",
            [("get_weather", W), ("g", "{}")],
        ),
        (
            "[TOOL_CALLS]get_weather[ARGS]" + W + "[TOOL_CALLS]g[ARGS]{}",
            None,
            [("get_weather", W), ("g", "{}")],
        ),
        ("plain [TOOL text", "plain [TOOL text", []),
    ],
    "pythonic": [
        (
            "[get_weather(city=\"Paris\", unit='c'), add(a=1, b=[2, 3], ok=True, x=null, )]",
            None,
            [("get_weather", W), ("add", '{"a": 1, "b": [2, 3], "ok": true, "x": null}')],
        ),
        ('<|python_start|>[f(s="a)b")]<|python_end|>', None, [("f", '{"s": "a)b"}')]),
        ("It is sunny.", "It is sunny.", []),
        ("[1, 2, 3]", "[1, 2, 3]", []),
    ],
}
# cut off inside a call (max_tokens): the whole response leaves it as content (as vLLM),
# a stream has already sent the call's name and its arguments so far
TRUNCATED = {'<tool_call>\n{"name": "f", "arguments": {"a": 1'}
ALL = [(name, *case) for name, cases in CASES.items() for case in cases]


def test_every_parser_has_samples():
    from common.config import TOOL_CALL_PARSERS

    assert set(CASES) == set(FORMATS) == set(TOOL_CALL_PARSERS)


@pytest.mark.parametrize("parser, text, content, calls", ALL)
def test_parse_whole_text(parser, text, content, calls):
    parsed = tool_format(parser).parse(text)
    assert parsed.content == content
    got = [(c.name, c.arguments) for c in parsed.calls]
    assert got == calls
    for _, args in got:
        assert isinstance(json.loads(args), dict)


def _assemble(parser: str, pieces: list[str]) -> tuple[str, list[tuple[str, str]], list[dict]]:
    """What the openai client builds from the deltas: content, and per index the id, name
    and concatenated argument fragments."""
    ts = ToolStream(tool_format(parser))
    content, calls, firsts = "", {}, []
    for k, piece in enumerate(pieces):
        text, deltas = ts.feed(piece, final=k == len(pieces) - 1)
        content += text
        for d in deltas:
            if "id" in d:  # a new call: id, type and name first, before any fragment
                assert d["index"] not in calls and d["type"] == "function"
                assert d["id"].startswith("call_")
                calls[d["index"]] = [d["function"]["name"], ""]
                firsts.append(d)
            calls[d["index"]][1] += d["function"].get("arguments", "")
    return content, [tuple(calls[i]) for i in sorted(calls)], firsts


@pytest.mark.parametrize("parser, text, content, calls", ALL)
def test_streamed_deltas_assemble_to_the_whole_parse(parser, text, content, calls):
    rng = random.Random(len(text))
    splits = [list(text), [text]]
    for _ in range(5):
        cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(1, 8))))
        splits.append([text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])])
    for pieces in splits:
        got_content, got_calls, _ = _assemble(parser, pieces)
        if text in TRUNCATED:  # what went out before the cut stays sent: a prefix
            assert all(name == "f" and '{"a": 1'.startswith(args) for name, args in got_calls)
            continue
        assert got_calls == calls, pieces
        # streamed content: the text before the calls (not stripped), or all of it
        if calls:
            assert got_content.strip() == (content or ""), pieces
        else:
            assert got_content == text, pieces


def test_stream_sends_the_name_before_the_arguments_end():
    """The name goes out as soon as it is complete, and argument fragments as they come,
    not once the whole call is written."""
    ts = ToolStream(tool_format("hermes"))
    assert ts.feed("Hi <tool", False) == ("Hi ", [])  # "<tool" held back: may be a tag
    assert ts.feed('_call>\n{"name": "get_w', False) == ("", [])
    _, deltas = ts.feed('eather", "arguments": {"ci', False)
    assert deltas[0]["function"] == {"name": "get_weather", "arguments": '{"ci'}
    _, deltas = ts.feed('ty": "Paris"}}\n</tool_call>', True)
    assert deltas == [{"index": 0, "function": {"arguments": 'ty": "Paris"}'}}]


def test_held_back_text_is_released_when_it_is_not_a_tag():
    ts = ToolStream(tool_format("hermes"))
    assert ts.feed("a <to", False) == ("a ", [])
    assert ts.feed("y> b", False) == ("<toy> b", [])
    assert ts.feed(" <", True) == (" <", [])


@pytest.mark.parametrize(
    "text, calls",
    [
        ('<tool_call>\n{"name": "delete_file", "arguments":', []),
        ('<tool_call>\n{"name": "delete_file",', []),
        ('<tool_call>\n{"name": "delete_file"', []),
        (
            '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>\n'
            '<tool_call>\n{"name": "g", "arguments":',
            [("f", "{}")],
        ),
    ],
)
def test_a_call_cut_before_its_arguments_is_no_call(text, calls):
    """max_tokens or a stop cutting a call after its name: the whole response never reads
    it as a call with no arguments (an agent would run delete_file({}))."""
    parsed = tool_format("hermes").parse(text)
    assert [(c.name, c.arguments) for c in parsed.calls] == calls
    if not calls:
        assert parsed.content == text


@pytest.mark.parametrize("parser", ["hermes", "mistral"])
def test_a_stream_sends_malformed_arguments_only_as_far_as_they_are_json(parser):
    """The model writes a bare word where a value goes: the stream stops the arguments
    before it, so every call's fragments still parse as partial JSON, the next call keeps
    its own index, and the choice is not "called" unless a call completed."""
    bad, good = '{"city": Paris}', '{"city": "Oslo"}'
    if parser == "hermes":
        text = (
            f'<tool_call>\n{{"name": "w", "arguments": {bad}}}\n</tool_call>\n'
            f'<tool_call>\n{{"name": "v", "arguments": {good}}}\n</tool_call>'
        )
    else:
        text = f"[TOOL_CALLS]w[ARGS]{bad}[TOOL_CALLS]v[ARGS]{good}"
    for pieces in (list(text), [text]):
        _, got, _ = _assemble(parser, pieces)
        assert got == [("w", '{"city": '), ("v", good)], pieces
    # only the malformed call: nothing completed
    ts = ToolStream(tool_format("hermes"))
    one = f'<tool_call>\n{{"name": "w", "arguments": {bad}}}\n</tool_call>'
    for ch in one:
        ts.feed(ch, False)
    ts.feed("", True)
    assert ts.num_calls == 1 and not ts.called
    assert tool_format("hermes").parse(one).calls == []
