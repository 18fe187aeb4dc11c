"""common/tool_formats/json_prefix.py: how much of a growing JSON text is still valid, as a
tool-call stream sends arguments (frontend.tools.stream)."""

from __future__ import annotations

import json
import random

import pytest

from common.tool_formats.json_prefix import JsonPrefix, json_prefix_len

CASES = {
    '{"city": "Par': 13,  # a string being written: all of it
    '{"city": Paris}': 9,  # a bare word where a value goes
    '{"a": 1}}': 8,  # a complete object, then a brace more
    '{"a": 1}  ': 10,  # whitespace after it is free
    "": 0,
    " {": 2,
    "[1]": 0,  # arguments are an object
    '{"a": -': 7,
    '{"a": -x': 7,
    '{"a": 01': 7,  # no leading zero
    '{"a": 1.': 8,
    '{"a": 1.e': 8,
    '{"a": 1e+5}': 11,
    '{"a": tru': 9,
    '{"a": trux': 9,
    '{"a": "\\u12G"}': 11,
    '{"a": "\\q"}': 8,
    '{"a": "x\n"}': 8,  # a raw control character in a string
    '{"a" 1}': 5,
    '{"a": [1, 2,]}': 12,
    '{"a": []}': 9,
    "{,": 1,
    '{"a":{}}': 8,
    '"{\\"city\\": 1}"': 0,  # arguments written as a JSON string
}


@pytest.mark.parametrize("text, want", list(CASES.items()))
def test_cases(text, want):
    assert json_prefix_len(text) == want


def _value(rng: random.Random, depth: int = 0):
    r = rng.random()
    if depth > 3 or r < 0.3:
        return rng.choice([0, -1.5e-3, 12, 'a"b\\é\n', True, None, False, 1e21, "", -0.0])
    if r < 0.6:
        return [_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    return {str(rng.random())[:4]: _value(rng, depth + 1) for _ in range(rng.randint(0, 3))}


def test_against_the_json_module():
    """Every prefix of a valid object is valid whole; a character more after it is not;
    a text the json module reads as an object is valid whole; and scanning it as it grows
    (JsonPrefix.extend, a piece at a time) gives what scanning it once does."""
    rng = random.Random(5)
    for _ in range(800):
        s = json.dumps(
            {"k": _value(rng)}, indent=rng.choice([None, 1]), ensure_ascii=rng.random() < 0.5
        )
        assert all(json_prefix_len(s[:k]) == k for k in range(len(s) + 1)), s
        assert json_prefix_len(s + "x") == len(s)
        k = rng.randrange(len(s))
        t = s[:k] + rng.choice('x}]:,"\\0 1e-') + s[k + 1 :]
        try:
            whole = isinstance(json.loads(t), dict)
        except ValueError:
            whole = False
        if whole:
            assert json_prefix_len(t) == len(t), t
        grown, cuts = JsonPrefix(), sorted(rng.sample(range(1, len(t) + 1), min(len(t), 5)))
        for c in cuts:
            assert grown.extend(t[:c]) == json_prefix_len(t[:c]), (t, c)
