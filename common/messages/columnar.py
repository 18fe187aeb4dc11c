"""One codec for the batch messages that carry one entry per request as parallel lists.

A step's outputs travel as columns (`rids[i]`, `texts[i]`, ... belong to request i): one
msgpack array per field, whose type the receiver checks once, not one map per request.
The code that builds and reads a batch works with records (one small dataclass per
request); a `Columnar` declares once which record field goes to which message column,
and does both directions:

    records ──pack──▶ {column: [value per record]} ──(message fields)──▶ wire
    wire ──▶ message ──unpack──▶ [record per rid]   (WireError if a column is short)

An *optional* column goes on the wire as None when no record sets it (most steps carry
no logprobs, timings or prompt logprobs), and reads back as None for every record.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping, Sequence
from operator import attrgetter
from typing import Any, Generic, TypeVar

from common.messages.base import Message, WireError

R = TypeVar("R")


@dataclasses.dataclass(frozen=True, slots=True)
class Column:
    field: str  # the record's field
    column: str  # the message's parallel list
    optional: bool = False  # None on the wire when every record has None


class Columnar(Generic[R]):
    """Pack records of one dataclass into a message's parallel lists, and back.

    Every field of `record` is a column of `message`, under the same name or the one in
    `rename`; those named in `optional` are optional columns. Checked when built: the
    message has each column, and the first field (the key, `rids`) is not optional. The
    columns keep the record's field order, so a row of them is the record's arguments."""

    def __init__(
        self,
        record: type[R],
        message: type[Message],
        *,
        rename: Mapping[str, str] | None = None,
        optional: Collection[str] = (),
    ) -> None:
        rename = dict(rename or {})
        names = [f.name for f in dataclasses.fields(record)]  # type: ignore[arg-type]
        unknown = (set(rename) | set(optional)) - set(names)
        if unknown:
            raise TypeError(f"{record.__name__} has no field {', '.join(sorted(unknown))}")
        columns = tuple(Column(n, rename.get(n, n), n in optional) for n in names)
        have = {f.name for f in dataclasses.fields(message)}  # type: ignore[arg-type]
        missing = [c.column for c in columns if c.column not in have]
        if missing:
            raise TypeError(f"{message.__name__} has no column {', '.join(missing)}")
        if columns[0].optional:
            raise TypeError("the key column cannot be optional")
        self.record = record
        self.columns = columns
        self._getters = tuple((c.column, c.optional, attrgetter(c.field)) for c in columns)

    def pack(self, records: Sequence[R]) -> dict[str, list | None]:
        """{column name: one value per record}; an optional column with no value set is
        None. The records' order is the rows' order."""
        out: dict[str, list | None] = {}
        for column, optional, get in self._getters:
            values = list(map(get, records))
            # count(None): one C loop (per-step cost on the scheduler's decode path)
            out[column] = None if optional and values.count(None) == len(values) else values
        return out

    def unpack(self, msg: Any, name: str | None = None) -> list[R]:
        """One record per entry of the key column of `msg` (a message, or its columns as
        attributes: `name` the message's); WireError if a (set) column is not as long as
        the key column (the schema checks each column's type, not their lengths)."""
        cols = [getattr(msg, c.column) for c in self.columns]
        n = len(cols[0])
        short = [c.column for c, v in zip(self.columns, cols) if v is not None and len(v) != n]
        if short:
            key = self.columns[0].column
            owner = name or type(msg).__name__
            raise WireError(f"{owner}: {', '.join(short)} not as long as {key} ({n})")
        none: list[Any] = [None] * n
        make = self.record
        return [make(*row) for row in zip(*(none if v is None else v for v in cols))]
