"""--mix chat: issue 52's chat mix of sampling options (what chat clients, agents and eval
harnesses send), and the checks each of its outputs must pass.

    request i:  a quarter greedy, the rest temperature 0.7 and top_p 0.9;
                a quarter seeded (seed 1000 + i);
                one in eight logprobs 5, one in eight presence_penalty 0.5;
                one in sixteen a json_schema response_format (a bounded object: any
                model, random weights included, closes it within a few tokens)

A streamed output fails its request (an error in the report) when a schema output does
not parse as its object, or a position's top logprobs sum past 1.
"""

from __future__ import annotations

import json
import math
from typing import Any

SCHEMA = {
    "type": "object",
    "properties": {
        "answer": {"type": "string", "enum": ["yes", "no"]},
        "score": {"type": "integer", "minimum": 0, "maximum": 9},
    },
    "required": ["answer", "score"],
    "additionalProperties": False,
}


def chat_mix(index: int, chat: bool) -> dict[str, Any]:
    """The body fields request `index` of the chat mix adds."""
    body: dict[str, Any] = {"temperature": 0.0}
    if index % 4:
        body.update(temperature=0.7, top_p=0.9)
    if index % 4 == 1:
        body["seed"] = 1000 + index
    if index % 8 == 2:
        body.update({"logprobs": True, "top_logprobs": 5} if chat else {"logprobs": 5})
    if index % 8 == 3:
        body["presence_penalty"] = 0.5
    if index % 16 == 6:
        body["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": "verdict", "schema": SCHEMA},
        }
    return body


def top_logprobs(choice: dict[str, Any], chat: bool) -> list[list[float]]:
    """Each streamed position's top logprobs in one chunk's choice (either dialect)."""
    lp = choice.get("logprobs") or {}
    if chat:
        return [
            [t["logprob"] for t in e.get("top_logprobs") or []] for e in lp.get("content") or []
        ]
    return [list(d.values()) for d in lp.get("top_logprobs") or [] if d]


def check_output(index: int, text: str, positions: list[list[float]]) -> str | None:
    """Why request `index`'s output breaks the mix's checks; None when it passes."""
    if index % 16 == 6:
        try:
            obj = json.loads(text)
        except ValueError as e:
            return f"schema output does not parse ({e}): {text[:120]!r}"
        if not (isinstance(obj, dict) and obj.get("answer") in ("yes", "no")):
            return f"schema output is not the object asked for: {text[:120]!r}"
        if not (isinstance(obj.get("score"), int) and 0 <= obj["score"] <= 9):
            return f"schema output's score out of its range: {text[:120]!r}"
    if index % 8 == 2 and not positions:
        return "asked for logprobs, got none"
    for i, lps in enumerate(positions):
        total = sum(math.exp(v) for v in lps)
        if total > 1.0 + 1e-3 or any(v > 1e-6 for v in lps):
            return f"position {i}: top logprobs {lps} sum to {total:.4f} (> 1)"
    return None
