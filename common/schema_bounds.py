"""What a JSON schema leaves open, bounded so that a small model's JSON ends.

    schema ─▶ bounded_schema() ─▶ llguidance (common.grammar, common.tool_formats)
      object listing `properties`, no additionalProperties   ─▶ those properties alone
      integer, a side unbounded                              ─▶ ±(10^15 - 1) on that side
      number,  a side unbounded                              ─▶ |x| < 1e16 (16 digits)
      (either, where that cap would cross its other side)    ─▶ ±1e18 on that side
      number,  no multipleOf                                 ─▶ multipleOf 1e-10 (10 decimals)
    json_object mode: JSON_OBJECT, any object whose numbers are bounded the same way

Each bound is one a JSON value stays valid under for every schema, and none makes a schema
unsatisfiable: a side the schema bounds itself is kept as written, an enum / const as it
is, a range too narrow for 10 decimals gets none; a bound past ±1e18 (the grammar
library's limit) is refused naming it.
Strings and arrays get no bound (their length is content; a schema's maxLength / maxItems
are honoured). A number has no exponent once bounded (llguidance writes a bounded number
in plain digits). The schema's top-level `"x-zeroserve": {"number_bounds": false}` lifts
the number and integer bounds (docs/structured-outputs.md). Torch-free, llguidance-free.
"""

from __future__ import annotations

import math
from decimal import Decimal
from typing import Any, TypeGuard

# an integer's cap: 15 digits, inside JSON's interoperable 2^53 - 1 (RFC 8259, section 6);
# a round cap's range is a plain digit count (2^53 - 1's cost ~15% more per mask: benchmarks.md)
INTEGER_LIMIT = 10**15 - 1
NUMBER_LIMIT = 1e16  # a number's integral part: 16 digits at most, as llama.cpp's
DECIMALS = 10  # a number's fraction digits: llguidance takes multipleOf down to 1e-10
LARGEST_BOUND = 1e18  # llguidance's number ranges are 64-bit: a bound past it cannot compile
OPTIONS_KEY = "x-zeroserve"


class SchemaBoundError(ValueError):
    """A schema whose number bound no grammar can take; the message names it and where."""


# keywords whose value is a subschema, a list of them ("items" either), or a map of names to
# them; _SAME_OBJECT's apply to the object their parent describes, so they stay open
# (closed, each would forbid the properties that the others add)
_SUBSCHEMA = {"items", "additionalProperties", "additionalItems", "unevaluatedItems"}
_SUBSCHEMA |= {"contains", "anyOf", "oneOf", "prefixItems"}
_MAP = ("properties", "patternProperties", "$defs", "definitions")
_SAME_OBJECT = ("allOf", "if", "then", "else")
_LOWER = ("minimum", "exclusiveMinimum")
_UPPER = ("maximum", "exclusiveMaximum")


def bounded_schema(schema: Any) -> Any:
    """The schema as llguidance gets it: closed objects, bounded numbers (unless its
    top-level OPTIONS_KEY lifts them), OPTIONS_KEY removed. SchemaBoundError for a
    number bound beyond LARGEST_BOUND or a malformed OPTIONS_KEY."""
    schema, numbers = split_options(schema)
    return closed_objects(schema, numbers=numbers)


def split_options(schema: Any) -> tuple[Any, bool]:
    """(the schema without its top-level OPTIONS_KEY, whether its numbers are bounded)."""
    if not isinstance(schema, dict) or OPTIONS_KEY not in schema:
        return schema, True
    schema = dict(schema)
    options = schema.pop(OPTIONS_KEY)
    if not (
        isinstance(options, dict)
        and set(options) <= {"number_bounds"}
        and isinstance(options.get("number_bounds", True), bool)
    ):
        raise SchemaBoundError(f'{OPTIONS_KEY}: takes {{"number_bounds": true | false}}')
    return schema, options.get("number_bounds", True)


def closed_objects(schema: Any, close: bool = True, numbers: bool = True, at: str = "") -> Any:
    """A copy of a JSON schema in which an object schema that lists `properties` and says
    nothing of `additionalProperties` (nor `unevaluatedProperties`) gets
    `additionalProperties: false`, at every depth: the declared properties only, as
    xgrammar, outlines and llama.cpp read such a schema (the JSON Schema reading, any
    other property allowed, lets a small model add properties until max_tokens). An
    explicit `additionalProperties` is kept; allOf's members (and if / then / else) are
    left open, their own subschemas closed. With `numbers`, integers and numbers get the
    bounds of the module docstring. `at`: this subschema's JSON pointer, for errors."""
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key in _MAP and isinstance(value, dict):
            out[key] = {
                k: closed_objects(v, True, numbers, f"{at}/{key}/{k}") for k, v in value.items()
            }
        elif key in _SUBSCHEMA or key in _SAME_OBJECT:
            shut = key not in _SAME_OBJECT
            if isinstance(value, list):
                out[key] = [
                    closed_objects(v, shut, numbers, f"{at}/{key}/{i}") for i, v in enumerate(value)
                ]
            else:
                out[key] = closed_objects(value, shut, numbers, f"{at}/{key}")
        else:
            out[key] = value
    if (
        close
        and isinstance(schema.get("properties"), dict)
        and "additionalProperties" not in schema
        and "unevaluatedProperties" not in schema
    ):
        out["additionalProperties"] = False
    for key in (*_LOWER, *_UPPER):
        v = schema.get(key)
        if _is_number(v) and abs(v) >= LARGEST_BOUND:
            where = f" at {at}" if at else ""
            raise SchemaBoundError(
                f"{key} {v:g}{where} is beyond ±{LARGEST_BOUND:g}, the largest number bound "
                "the grammar library takes"
            )
    kinds = schema.get("type")
    kinds = kinds if isinstance(kinds, list) else [kinds]
    numbers = numbers and "enum" not in schema and "const" not in schema  # finite already
    if numbers and "number" in kinds:
        out.update(number_bounds(schema, integer=False))
    elif numbers and "integer" in kinds:
        out.update(number_bounds(schema, integer=True))
    return out


def number_bounds(schema: dict[str, Any], integer: bool) -> dict[str, Any]:
    """The bound keywords to add to a number (or integer) schema: a cap on each side it
    leaves open (LARGEST_BOUND where the cap would cross its other side), and for a number
    without multipleOf, DECIMALS fraction digits where its range holds such a value."""
    lo, lo_open = _side(schema, _LOWER, max)
    hi, hi_open = _side(schema, _UPPER, min)
    cap = INTEGER_LIMIT if integer else NUMBER_LIMIT
    add: dict[str, Any] = {}
    if lo is None:
        lo, lo_open = -cap if hi is None or hi > -cap else -LARGEST_BOUND, not integer
        add["minimum" if integer else "exclusiveMinimum"] = lo
    if hi is None:
        hi, hi_open = cap if lo < cap else LARGEST_BOUND, not integer
        add["maximum" if integer else "exclusiveMaximum"] = hi
    if not integer and "multipleOf" not in schema and _holds_decimal(lo, lo_open, hi, hi_open):
        add["multipleOf"] = float(f"1e-{DECIMALS}")
    return add


def _is_number(v: Any) -> TypeGuard[float]:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _side(schema: dict[str, Any], keys: tuple[str, str], tighter: Any) -> tuple[Any, bool]:
    """(the schema's bound on one side or None, whether it is exclusive)."""
    found = [(schema[k], k.startswith("exclusive")) for k in keys if _is_number(schema.get(k))]
    if not found:
        return None, False
    best = tighter(v for v, _ in found)
    return best, any(v == best and ex for v, ex in found)


def _holds_decimal(lo: Any, lo_open: bool, hi: Any, hi_open: bool) -> bool:
    """Whether [lo, hi] (open where said; None: unbounded) holds a multiple of 10^-DECIMALS."""
    if lo is None or hi is None:
        return True
    scale = Decimal(10) ** DECIMALS
    first, last = Decimal(repr(lo)) * scale, Decimal(repr(hi)) * scale
    k_lo = math.floor(first) + 1 if lo_open or first != math.ceil(first) else int(first)
    k_hi = math.ceil(last) - 1 if hi_open or last != math.floor(last) else int(last)
    return k_lo <= k_hi


JSON_OBJECT: dict[str, Any] = {
    # json_object mode: an object of any JSON values (no type: every type), their numbers
    # bounded as a schema's are; closed_objects leaves it as it is
    "$defs": {
        "value": {
            "items": {"$ref": "#/$defs/value"},
            "additionalProperties": {"$ref": "#/$defs/value"},
            **number_bounds({}, integer=False),
        }
    },
    "type": "object",
    "additionalProperties": {"$ref": "#/$defs/value"},
}
