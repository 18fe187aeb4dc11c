"""A list[list | None] column (a step's logprobs) checked a level at a time
(base._json_lists) answers as the item-by-item check does: the same value, or a WireError
where that one raises."""

from __future__ import annotations

import random

import pytest

from common.messages.base import MAX_DEPTH, WireError, _list_of, checker_for


def _slow():
    return _list_of(checker_for(list | None), None, True)


def _value(rng: random.Random, depth: int):
    """A random value: mostly JSON-like lists and scalars, at times a tuple, a dict, bytes or
    another type, some nested past MAX_DEPTH."""
    r = rng.random()
    if depth < MAX_DEPTH + 2 and r < 0.35:
        n = rng.choice((0, 1, 2, 5))
        items = [_value(rng, depth + 1) for _ in range(n)]
        return tuple(items) if rng.random() < 0.03 else items
    if r < 0.37:
        return {"k": _value(rng, depth + 1)} if rng.random() < 0.8 else {1: 2}
    if r < 0.39:
        return rng.choice((b"x", object(), 1j, bytearray(b"y")))
    return rng.choice((None, True, 3, -0.25, float("nan"), "s"))


def _deep(depth: int) -> list:
    v: list = [[3, -0.5]]
    for _ in range(depth):
        v = [v]
    return v


def _answer(check, column):
    try:
        return "ok", check(column)
    except WireError:
        return "error", None


def test_random_columns_answer_as_the_item_by_item_check():
    rng = random.Random(0)
    fast, slow = checker_for(list[list | None]), _slow()
    seen = {"ok": 0, "error": 0, "fast": 0}
    for _ in range(4000):
        rows = rng.choice((1, 2, 8, 32))
        column: object = [
            None
            if rng.random() < 0.6
            else _value(rng, -1)
            if rng.random() < 0.2
            else [[rng.random(), [[rng.randrange(100), -rng.random()] for _ in range(5)]]]
            for _ in range(rows)
        ]
        if rng.random() < 0.02:
            column = tuple(column)  # type: ignore[arg-type]
        got, want = _answer(fast, column), _answer(slow, column)
        assert got == want or (got[0] == want[0] == "ok" and repr(got) == repr(want))
        seen[got[0]] += 1
        seen["fast"] += got[1] is column  # the level check's answer (the slow one copies)
    assert seen["ok"] > 1000 and seen["error"] > 200  # both answers were exercised
    assert seen["fast"] > 1000


@pytest.mark.parametrize("depth", [MAX_DEPTH - 3, MAX_DEPTH - 2, MAX_DEPTH - 1, MAX_DEPTH])
def test_the_depth_bound_is_the_item_checks(depth):
    fast, slow = checker_for(list[list | None]), _slow()
    column = [None, _deep(depth), [[-0.5, [[1, -0.5]]]]]
    assert _answer(fast, column)[0] == _answer(slow, column)[0]
    assert (_answer(fast, column)[0] == "ok") == (depth < MAX_DEPTH - 1)
