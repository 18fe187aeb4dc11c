"""Wire primitives shared by every edge module: the Message base, the schema checker, ids.

A field's annotation *is* its schema. `compile_schema(cls)` turns the annotations of a
message dataclass into one checker per field; a checker returns the (normalised) value
or raises WireError. Supported annotations: int, float (accepts int), str, bool (never an
int), bytes, `X | Y` unions (`X | None`), `list[T]`, `tuple[A, B, ...]` (a fixed-length
array, decoded to a tuple), and bare `list` / `dict` / `dict[str, Any]` / `Any`, which
accept JSON-like values only (None, bool, int, float, str, lists and str-keyed maps).
"""

from __future__ import annotations

import dataclasses
import struct
import sys
import types
import typing
from array import array
from collections.abc import Callable, Sequence
from itertools import chain, compress, repeat
from operator import is_, is_not
from typing import Any, ClassVar

from common.wire_struct import WireStruct

WIRE_VERSION = 15  # 2: return_timings stays in the frontend; 3: prompt logprobs, tokenizer
# calls; 4: scheduler replicas; 5: EngineStatus.weight_bytes; 6: SamplingParams.structured,
# TokenizeRequest.tools, prefix-cache counters on step outputs, no TokenizeAck; 7: model
# facts (EngineStatus.block_size, ComponentStatus.facts), no arrival_time on the requests; 8: SamplingParams typed on the wire
# (a WireStruct), max_tokens settled by the tokenizer (no TokenizeRequest.max_tokens_unset);
# 9: EngineStatus.device and .gpus (replica placement); 10: SamplingParams.speculative;
# 11: EngineStatus.spec and .spec_method; 12: TokenizeRequest.prediction,
# GenerateRequest.prediction_token_ids; 13: StepOutputs' integer columns packed (token ids,
# their counts, prompt and output lengths), finish_reasons None when no row finished; 14:
# StepOutputs.token_logprobs (one token's logprobs a row, packed); 15:
# TokenizeRequest.continue_final, StepOutputs.new_requests' min_tokens
MAX_FRAME_BYTES = 64 << 20  # a whole frame; strings and bytes inside are bounded by it
MAX_LIST = 1 << 20  # elements of any array or map
MAX_DEPTH = 32  # nesting of JSON-like values
INT32_MAX = 2**31 - 1

Checker = Callable[[Any], Any]


class WireError(ValueError):
    """A frame (or a message about to be sent) does not match the wire schema."""


class Message:
    """Base of every wire message: a frozen, slotted dataclass with a unique ClassVar TAG."""

    __slots__ = ()
    TAG: ClassVar[int]


def _fail(what: str, value: Any) -> WireError:
    return WireError(f"expected {what}, got {type(value).__name__}")


def _check_int(v: Any) -> int:
    if type(v) is not int:  # exact type: bool (and int subclasses) are rejected
        raise _fail("int", v)
    return v


def _check_float(v: Any) -> float:
    t = type(v)
    if t is float:
        return v
    if t is int:
        return float(v)
    raise _fail("float", v)


def _exact(tp: type) -> Checker:
    def check(v: Any) -> Any:
        if type(v) is not tp:
            raise _fail(tp.__name__, v)
        return v

    return check


_JSON_SCALARS = frozenset((type(None), bool, int, float, str))
_JSON_SCALARS_OR_LIST = _JSON_SCALARS | {list}


def check_json(v: Any, depth: int = 0) -> Any:
    """JSON-like values only: None, bool, int, float, str, list, dict with str keys."""
    t = type(v)
    if v is None or t in (bool, int, float, str):
        return v
    if depth >= MAX_DEPTH:
        raise WireError(f"value nested deeper than {MAX_DEPTH}")
    if t is list or t is tuple:
        if len(v) > MAX_LIST:
            raise WireError(f"list longer than {MAX_LIST}")
        kinds = set(map(type, v))
        if kinds <= _JSON_SCALARS:  # a leaf (a logprob's [id, value]): one C pass
            return v if t is list else list(v)
        # lists of leaves (a top-N's [[id, value], ...]): C passes over them all
        if (
            kinds == {list}
            and depth + 1 < MAX_DEPTH
            and max(map(len, v)) <= MAX_LIST
            and set(map(type, chain.from_iterable(v))) <= _JSON_SCALARS
        ):
            return v if t is list else list(v)
        return [check_json(x, depth + 1) for x in v]
    if t is dict:
        if len(v) > MAX_LIST:
            raise WireError(f"map larger than {MAX_LIST}")
        for k in v:
            if type(k) is not str:
                raise WireError(f"map key must be str, got {type(k).__name__}")
        return {k: check_json(x, depth + 1) for k, x in v.items()}
    raise _fail("JSON-like value", v)


def _check_json_list(v: Any) -> list:
    if type(v) is not list and type(v) is not tuple:
        raise _fail("list", v)
    return check_json(v)


def _check_json_dict(v: Any) -> dict:
    if type(v) is not dict:
        raise _fail("dict", v)
    return check_json(v)


def _list_of(item: Checker, exact: frozenset[type] | None, optional: bool = False) -> Checker:
    """optional: an item may be None (taken as is: only the others are checked, found in
    C, e.g. a step's logprobs column where most rows have none)."""

    def check(v: Any) -> list:
        if type(v) is not list and type(v) is not tuple:
            raise _fail("list", v)
        if len(v) > MAX_LIST:
            raise WireError(f"list longer than {MAX_LIST}")
        # fast path (list[int], list[str | None], ...): the items' types in one C-level pass
        if exact is not None and set(map(type, v)) <= exact:
            return v if type(v) is list else list(v)
        if optional:
            out = list(v)
            for i in compress(range(len(v)), map(is_not, v, repeat(None))):
                out[i] = item(v[i])
            return out
        return [item(x) for x in v]

    return check


def _json_lists(slow: Checker) -> Checker:
    """list[list | None] (a step's logprobs column): the rows' JSON-like lists checked a
    nesting level at a time, each level's items in C passes (a step's, not a row's); a
    column those passes do not prove fine goes to `slow`, the item-by-item check, whose
    answer (or error) it is."""

    def check(v: Any) -> Any:
        if type(v) is list and len(v) <= MAX_LIST:
            level = list(compress(v, map(is_not, v, repeat(None))))
            if not level or _json_levels(level):
                return v
        return slow(v)

    return check


def _json_levels(level: list) -> bool:
    """Every item of `level` (lists, at depth 0) holds only lists and JSON scalars, each
    list within MAX_LIST and MAX_DEPTH, as check_json takes them as they are: True. False
    where that is not shown (a tuple, a dict, another type, a bound passed)."""
    depth = 0
    while True:
        if depth >= MAX_DEPTH or set(map(type, level)) != {list}:
            return False
        if max(map(len, level)) > MAX_LIST:
            return False
        items = list(chain.from_iterable(level))
        kinds = set(map(type, items))
        if kinds <= _JSON_SCALARS:
            return True
        if not kinds <= _JSON_SCALARS_OR_LIST:
            return False
        level = list(compress(items, map(is_, map(type, items), repeat(list))))
        depth += 1


def _tuple_of(items: tuple[Checker, ...]) -> Checker:
    def check(v: Any) -> tuple:
        if type(v) is not list and type(v) is not tuple:
            raise _fail(f"array of {len(items)}", v)
        if len(v) != len(items):
            raise WireError(f"expected array of {len(items)}, got {len(v)} elements")
        return tuple(c(x) for c, x in zip(items, v))

    return check


def _union_of(options: tuple[Checker, ...], allow_none: bool) -> Checker:
    def check(v: Any) -> Any:
        if v is None:
            if allow_none:
                return None
            raise WireError("unexpected None")
        errors = []
        for c in options:
            try:
                return c(v)
            except WireError as e:
                errors.append(str(e))
        raise WireError(" or ".join(errors))

    return check


def check_fields(
    owner: str, schema: tuple[tuple[str, Checker], ...], values: list[Any] | tuple[Any, ...]
) -> list[Any]:
    """A message's or a struct's field values, each checked by its field's checker."""
    if len(values) != len(schema):
        raise WireError(f"{owner}: expected {len(schema)} fields, got {len(values)}")
    out = []
    for (name, check), v in zip(schema, values):
        try:
            out.append(check(v))
        except WireError as e:
            raise WireError(f"{owner}.{name}: {e}") from None
    return out


def _struct_of(cls: type, schema: tuple[tuple[str, Checker], ...]) -> Checker:
    def check(v: Any) -> Any:
        if isinstance(v, cls):  # encode: the array of its fields
            return check_fields(cls.__name__, schema, [getattr(v, name) for name, _ in schema])
        if type(v) is list or type(v) is tuple:  # decode: the struct
            return cls(*check_fields(cls.__name__, schema, v))
        raise _fail(cls.__name__, v)

    return check


def _int_map_of(value: Checker) -> Checker:
    def check(v: Any) -> Any:
        pairs: list[Any] | tuple[Any, ...]
        if type(v) is dict:  # encode: the pairs
            pairs = list(v.items())
            encoding = True
        elif type(v) is list or type(v) is tuple:
            pairs, encoding = v, False
        else:
            raise _fail("map of int keys", v)
        if len(pairs) > MAX_LIST:
            raise WireError(f"map larger than {MAX_LIST}")
        out = []
        for pair in pairs:
            if (type(pair) is not list and type(pair) is not tuple) or len(pair) != 2:
                raise WireError("expected [key, value] pairs")
            out.append((_check_int(pair[0]), value(pair[1])))
        return [list(p) for p in out] if encoding else dict(out)

    return check


_SCALARS: dict[Any, Checker] = {
    int: _check_int,
    float: _check_float,
    str: _exact(str),
    bool: _exact(bool),
    bytes: _exact(bytes),
    list: _check_json_list,
    dict: _check_json_dict,
    Any: check_json,
}
_EXACT_ITEMS = (int, str, bool, bytes)


def _exact_types(tp: Any) -> frozenset[type] | None:
    """The types an item of `tp` may have when each is taken as is (int, str, bool, bytes,
    a union of them, None included); None where an item needs its checker."""
    if tp in _EXACT_ITEMS:
        return frozenset((tp,))
    if typing.get_origin(tp) in (types.UnionType, typing.Union):
        args = typing.get_args(tp)
        if all(a in _EXACT_ITEMS or a is type(None) for a in args):
            return frozenset(args)
    return None


def checker_for(tp: Any) -> Checker:
    if tp in _SCALARS:
        return _SCALARS[tp]
    if isinstance(tp, type) and issubclass(tp, WireStruct):
        return _struct_of(tp, _fields_of(tp))
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (types.UnionType, typing.Union):
        options = tuple(checker_for(a) for a in args if a is not type(None))
        return _union_of(options, allow_none=type(None) in args)
    if origin is list and len(args) == 1:
        optional = type(None) in typing.get_args(args[0])
        slow = _list_of(checker_for(args[0]), _exact_types(args[0]), optional)
        return _json_lists(slow) if args[0] == list | None else slow
    if origin is tuple and args and args[-1] is not Ellipsis:
        return _tuple_of(tuple(checker_for(a) for a in args))
    if origin is dict and args[:1] == (str,):
        return _check_json_dict
    if origin is dict and args[:1] == (int,):
        return _int_map_of(checker_for(args[1]))
    raise TypeError(f"unsupported wire annotation: {tp!r}")


def _fields_of(cls: type) -> tuple[tuple[str, Checker], ...]:
    hints = typing.get_type_hints(cls, vars(sys.modules[cls.__module__]))
    return tuple((f.name, checker_for(hints[f.name])) for f in dataclasses.fields(cls))


def compile_schema(cls: type) -> tuple[tuple[str, Checker], ...]:
    """One (field name, checker) pair per dataclass field, in declaration order."""
    if not (isinstance(cls, type) and issubclass(cls, Message) and dataclasses.is_dataclass(cls)):
        raise TypeError(f"{cls!r} is not a Message dataclass")
    return _fields_of(cls)


# -- token ids: little-endian int32, 4 bytes per id ------------------------------------------

_SWAP = sys.byteorder != "little"
assert array("i").itemsize == 4


_ONE_ID = struct.Struct("<i")


def pack_ids(ids: Sequence[int]) -> bytes:
    """Pack token ids (each in [0, 2**31)) as little-endian int32."""
    if len(ids) == 1 and type(ids[0]) is int and 0 <= ids[0] < 1 << 31:
        return _ONE_ID.pack(ids[0])  # a decode step's one token a request: most calls
    try:
        data = struct.pack(f"<{len(ids)}i", *ids)
    except struct.error as e:
        raise WireError(f"token ids must be int32: {e}") from None
    # a negative one has its top byte's high bit set; one C scan (array('i') and min()
    # took 4x as long: a step packs three columns of its rows, scheduler_detok.py)
    if not data[3::4].isascii():
        raise WireError(f"token ids must be >= 0, got {min(ids)}")
    return data


def unpack_ids(data: bytes) -> list[int]:
    if type(data) is not bytes or len(data) % 4:
        raise WireError(f"packed ids must be bytes of a multiple of 4, got {len(data)} bytes")
    a = array("i")
    a.frombytes(data)
    if _SWAP:
        a.byteswap()
    if a and min(a) < 0:
        raise WireError("packed ids contain a negative id")
    return a.tolist()
