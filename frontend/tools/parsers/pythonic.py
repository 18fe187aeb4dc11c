"""Pythonic tool calls (Llama 3.2 / 4 prompts, ToolACE and others): a Python list of calls
with keyword arguments,

    [get_weather(city="Paris"), get_time(zone="CET", exact=True)]

optionally between <|python_start|> and <|python_end|>. Values are Python literals (JSON's
true/false/null are read too); the arguments are sent as the JSON of the keywords. The
output is calls only when it begins with "[" (after whitespace or <|python_start|>). A
stream gets each call whole, once its closing parenthesis is written.
"""

from __future__ import annotations

import ast
import json
from typing import Any

from frontend.tools.parsers.base import PartialCall, ToolParser, skip_ws

OPEN, CLOSE = "<|python_start|>", "<|python_end|>"
_JSON_NAMES = {"true": True, "false": False, "null": None}


def _literal(node: ast.expr) -> Any:
    if isinstance(node, ast.Name) and node.id in _JSON_NAMES:
        return _JSON_NAMES[node.id]
    if isinstance(node, ast.List):
        return [_literal(e) for e in node.elts]
    if isinstance(node, ast.Tuple):
        return [_literal(e) for e in node.elts]
    if isinstance(node, ast.Dict):
        if any(k is None for k in node.keys):
            raise ValueError("** in a dict")
        return {_literal(k): _literal(v) for k, v in zip(node.keys, node.values) if k is not None}
    return ast.literal_eval(node)


def call_of(source: str) -> PartialCall | None:
    """One complete call `name(k=v, ...)`, or None when it is not one."""
    try:
        node = ast.parse(source.strip(), mode="eval").body
    except SyntaxError:
        return None
    if not isinstance(node, ast.Call) or node.args:
        return None
    func = node.func
    name = func.id if isinstance(func, ast.Name) else None
    if isinstance(func, ast.Attribute):  # dotted names: module.function
        name = ast.unparse(func)
    if name is None:
        return None
    try:
        args = {kw.arg: _literal(kw.value) for kw in node.keywords if kw.arg is not None}
        text = json.dumps(args, ensure_ascii=False)
    except (ValueError, TypeError, SyntaxError):
        return None
    return PartialCall(name, text, True)


def _item_end(text: str, i: int) -> int | None:
    """The end of the call starting at text[i]: after its closing parenthesis."""
    depth, quote, n = 0, "", len(text)
    while i < n:
        ch = text[i]
        if quote:
            if ch == "\\":
                i += 1
            elif ch == quote:
                quote = ""
        elif ch in "\"'":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
            if depth == 0 and ch == ")":
                return i + 1
            if depth < 0:
                return None
        i += 1
    return None


class PythonicParser(ToolParser):
    name = "pythonic"
    needs_special_tokens = True  # <|python_start|>

    def start(self, text: str) -> int | None:
        i = skip_ws(text, 0)
        if text.startswith(OPEN, i) or text.startswith("[", i):
            return i
        return None

    def hold_back(self, text: str) -> int:
        rest = text[skip_ws(text, 0) :]
        return len(text) if OPEN.startswith(rest) else 0

    def calls(self, region: str, final: bool) -> list[PartialCall]:
        i = skip_ws(region, 0)
        if region.startswith(OPEN, i):
            i = skip_ws(region, i + len(OPEN))
        if i >= len(region) or region[i] != "[":
            return []
        i = skip_ws(region, i + 1)
        out: list[PartialCall] = []
        while i < len(region) and (region[i].isalpha() or region[i] == "_"):
            end = _item_end(region, i)
            if end is None:
                break
            call = call_of(region[i:end])
            if call is None:
                break
            out.append(call)
            i = skip_ws(region, end)
            if i < len(region) and region[i] == ",":
                i = skip_ws(region, i + 1)
        return out
