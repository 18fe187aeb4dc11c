"""Pythonic tool calls (Llama 3.2 / 4 prompts, ToolACE and others): a Python list of calls
with keyword arguments,

    [get_weather(city="Paris"), get_time(zone="CET", exact=True)]

optionally between <|python_start|> and <|python_end|>. Values are Python literals (JSON's
true/false/null are read too); the arguments are sent as the JSON of the keywords. The
output is calls only when it begins with "[" (after whitespace or <|python_start|>). A
stream gets each call whole, once its closing parenthesis is written. A grammar writes
`[f(k=V, k2=V2, ), g()]`: the schema's properties in order, each `name=<JSON value>, `
(required ones always, the others optionally).
"""

from __future__ import annotations

import ast
import json
from typing import Any

from common.schema_bounds import split_options
from common.tool_formats.base import (
    PartialCall,
    ToolFormat,
    dumps,
    lit,
    schema_rule,
    skip_ws,
)

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


class PythonicFormat(ToolFormat):
    name = "pythonic"
    needs_special_tokens = True  # <|python_start|>
    OPEN, CLOSE = "[", "]"
    lead, first = "<|python_start|>", "["

    HOW_TO_CALL = (
        "To call functions, respond only with a Python list of calls with keyword arguments: "
        "[func_name1(param1=value1, param2=value2), func_name2(param=value)]"
    )

    def write_call(self, fn: dict[str, Any]) -> str:
        args = fn.get("arguments", {})
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except ValueError:
                args = {}
        pairs = args.items() if isinstance(args, dict) else ()
        return f"{fn.get('name')}(" + ", ".join(f"{k}={dumps(v)}" for k, v in pairs) + ")"

    def call_rules(self, fn: dict[str, Any], k: int) -> list[str]:
        params, numbers = split_options(fn["parameters"])
        props: dict[str, Any] = params.get("properties") or {}
        required = set(params.get("required") or ())
        items, rules = [], []
        for j, (key, sub) in enumerate(props.items()):
            rules.append(f"v_{k}_{j}: {schema_rule(sub if isinstance(sub, dict) else {}, numbers)}")
            item = f"{lit(key + '=')} v_{k}_{j} {lit(', ')}"
            items.append(item if key in required else f"({item})?")
        body = " ".join(items)
        return [f"fn_{k}: {lit(fn['name'] + '(')} {body} {lit(')')}", *rules]

    def calls(self, region: str, final: bool) -> list[PartialCall]:
        i = self.after_lead(region)
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
