"""The base of a dataclass that travels inside wire messages as a typed struct.

Kept out of common.messages, whose message modules carry such structs (SamplingParams):
the struct's module imports this one without importing the messages.
"""

from __future__ import annotations


class WireStruct:
    """Base of a dataclass that travels inside messages as an array of all its fields in
    declaration order, each field's annotation its schema (common.messages.base). Not a
    message itself: no TAG, never a frame of its own."""

    __slots__ = ()
