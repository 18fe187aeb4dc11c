"""Random JSON schemas for the structured-output validity fuzz.

Bounded (depth 2, at most 4 properties, arrays of at most 3 items, short strings) so a
small max_tokens lets most outputs finish; the keywords are those agent frameworks send
(pydantic's output): type and type lists, properties/required/additionalProperties,
items/minItems/maxItems, enum, const, anyOf, string lengths and patterns, integer and
number bounds (inclusive and exclusive).
"""

from __future__ import annotations

import random
from typing import Any

PATTERNS = ("^[a-z]{2,6}$", "^[A-Z][a-z]{1,5}$", "^[0-9]{3}-[0-9]{2}$", "^(yes|no)$")
WORDS = ("alpha", "beta", "gamma", "delta", "x", "y z", 'q"uote', "ünï")


def leaf(rng: random.Random) -> dict[str, Any]:
    kind = rng.choice(
        ["string", "string", "integer", "integer", "number", "boolean", "null", "enum", "const"]
    )
    if kind == "string":
        s: dict[str, Any] = {"type": "string"}
        r = rng.random()
        if r < 0.3:
            s["pattern"] = rng.choice(PATTERNS)
        elif r < 0.7:
            s["maxLength"] = rng.randint(1, 12)
            if rng.random() < 0.4:
                s["minLength"] = rng.randint(0, s["maxLength"])
        return s
    if kind == "integer":
        s = {"type": "integer"}
        lo = rng.randint(-50, 50)
        if rng.random() < 0.6:
            s["minimum"] = lo
        if rng.random() < 0.6:
            s["maximum"] = lo + rng.randint(0, 1000)
        if rng.random() < 0.2:
            s.pop("minimum", None)
            s["exclusiveMinimum"] = lo
        return s
    if kind == "number":
        s = {"type": "number"}
        if rng.random() < 0.5:
            s["minimum"] = rng.choice([0, -1.5, 2.25])
        if rng.random() < 0.5:
            s["maximum"] = rng.choice([10, 100.5, 1e6])
        return s
    if kind == "enum":
        vals = rng.sample(WORDS, rng.randint(1, 4))
        if rng.random() < 0.3:
            vals.append(rng.choice([1, 2.5, None, True]))
        return {"enum": vals}
    if kind == "const":
        return {"const": rng.choice([*WORDS, 7, False])}
    return {"type": kind}


def schema(rng: random.Random, depth: int = 0) -> dict[str, Any]:
    r = rng.random()
    if depth >= 2 or r < 0.35:
        s = leaf(rng)
        if rng.random() < 0.1 and "type" in s and s["type"] != "null":
            s = {**s, "type": [s["type"], "null"]}
        return s
    if r < 0.7:
        names = rng.sample(["id", "name", "value", "tags", "meta", "ok", "score", "kind"], 4)
        props = {n: schema(rng, depth + 1) for n in names[: rng.randint(1, 4)]}
        required = [n for n in props if rng.random() < 0.7]
        return {
            "type": "object",
            "properties": props,
            "required": required,
            "additionalProperties": False,
        }
    if r < 0.9:
        s = {"type": "array", "items": schema(rng, depth + 1), "maxItems": rng.randint(1, 3)}
        if rng.random() < 0.5:
            s["minItems"] = 1
        return s
    return {"anyOf": [schema(rng, depth + 1), leaf(rng)]}


def top_level(rng: random.Random) -> dict[str, Any]:
    """An object at the top, as response_format's json_schema always is."""
    while True:
        s = schema(rng)
        if s.get("type") == "object":
            return s
