"""Wire protocol: one module per edge of the process graph, one tag registry, one codec.

```
 clients ─HTTP─▶ frontend ──TokenizeRequest──▶ tokenizer_worker × N ──GenerateRequest──▶ scheduler_worker
                  ▲  │        (frontend_tokenizer)      │          (tokenizer_scheduler)     │  ▲
                  │  │  TokenizerCall ⇄ TokenizerReply  │  (/tokenize, answered by the worker)  │
                  │  └─────────── AbortRequest ─────────┼────────────────────────────────────┘  │
                  │               (tokenizer_scheduler) │ RequestError (errors)                  │ AbortRequest
                  │                                     ▼                                        │ (stop string hit)
                  └──────── PULL (frontend inbox) ◀──TextOutputs── detok_worker ◀──StepOutputs──┘
                             ▲        ▲              (detok_frontend)            (scheduler_detok)
                             │        └── EngineStatus from scheduler_worker (scheduler_frontend)
                             └── ComponentStatus from every component (status)
```

A frame is one msgpack array `[WIRE_VERSION, TAG, field1, field2, ...]`, fields in
declaration order. Decoding checks every field against its annotation (see `base`); any
mismatch raises WireError, which receivers log and drop. No pickle anywhere: a pickled
frame on a socket is a remote-code-execution hole.
"""

from __future__ import annotations

from typing import Any

import msgpack

from common.messages.base import (
    MAX_FRAME_BYTES,
    MAX_LIST,
    WIRE_VERSION,
    Checker,
    Message,
    WireError,
    check_fields,
    compile_schema,
    pack_ids,
    unpack_ids,
)
from common.messages.detok_frontend import (
    TextOutput,
    TextOutputs,
    join_outputs,
    pack_text_outputs,
    unpack_text_outputs,
)
from common.messages.errors import RequestError
from common.messages.frontend_tokenizer import TokenizerCall, TokenizeRequest
from common.messages.scheduler_detok import (
    NewRequest,
    StepOutput,
    StepOutputs,
    pack_step_outputs,
    unpack_step_outputs,
)
from common.messages.scheduler_frontend import EngineStatus
from common.messages.status import ComponentStatus
from common.messages.tokenizer_frontend import TokenizerReply
from common.messages.tokenizer_scheduler import AbortRequest, GenerateRequest

__all__ = [
    "MAX_FRAME_BYTES",
    "MAX_LIST",
    "WIRE_VERSION",
    "REGISTRY",
    "Message",
    "WireError",
    "encode",
    "decode",
    "pack_ids",
    "unpack_ids",
    "register",
    "TokenizeRequest",
    "GenerateRequest",
    "AbortRequest",
    "StepOutputs",
    "NewRequest",
    "EngineStatus",
    "TextOutputs",
    "RequestError",
    "ComponentStatus",
    "TokenizerCall",
    "TokenizerReply",
    "StepOutput",
    "pack_step_outputs",
    "unpack_step_outputs",
    "TextOutput",
    "join_outputs",
    "pack_text_outputs",
    "unpack_text_outputs",
]

# tag -> class, and the compiled schema of each registered class
REGISTRY: dict[int, type[Message]] = {}
_SCHEMAS: dict[type[Message], tuple[tuple[str, Checker], ...]] = {}


def register(cls: type[Message]) -> type[Message]:
    tag = cls.__dict__.get("TAG")
    if type(tag) is not int or tag < 0:
        raise TypeError(f"{cls.__name__} needs its own ClassVar TAG: int >= 0")
    if tag in REGISTRY:
        raise ValueError(f"duplicate wire tag {tag}: {cls.__name__} and {REGISTRY[tag].__name__}")
    _SCHEMAS[cls] = compile_schema(cls)
    REGISTRY[tag] = cls
    return cls


for _cls in (
    TokenizeRequest,
    GenerateRequest,
    AbortRequest,
    StepOutputs,
    EngineStatus,
    TextOutputs,
    RequestError,
    ComponentStatus,
    TokenizerCall,
    TokenizerReply,
):
    register(_cls)


def _checked_values(cls: type[Message], values: list[Any] | tuple[Any, ...]) -> list[Any]:
    return check_fields(cls.__name__, _SCHEMAS[cls], values)


def encode(msg: Message) -> bytes:
    """Schema-check and pack a message; WireError if it does not fit the schema."""
    cls = type(msg)
    if cls not in _SCHEMAS or REGISTRY.get(cls.TAG) is not cls:
        raise WireError(f"{cls.__name__} is not a registered message type")
    values = _checked_values(cls, [getattr(msg, name) for name, _ in _SCHEMAS[cls]])
    try:
        frame = msgpack.packb([WIRE_VERSION, cls.TAG, *values], use_bin_type=True)
    except (TypeError, ValueError, OverflowError) as e:  # a struct given in its wire form
        raise WireError(f"{cls.__name__}: not packable: {e}") from None
    if len(frame) > MAX_FRAME_BYTES:
        raise WireError(f"{cls.__name__}: frame of {len(frame)} bytes exceeds {MAX_FRAME_BYTES}")
    return frame


def decode(frame: bytes) -> Message:
    """Unpack and schema-check one frame; WireError on anything malformed."""
    if not isinstance(frame, (bytes, bytearray, memoryview)):
        raise WireError(f"frame must be bytes, got {type(frame).__name__}")
    if len(frame) > MAX_FRAME_BYTES:
        raise WireError(f"frame of {len(frame)} bytes exceeds {MAX_FRAME_BYTES}")
    try:
        obj = msgpack.unpackb(
            frame,
            raw=False,
            strict_map_key=True,
            use_list=True,
            max_str_len=MAX_FRAME_BYTES,
            max_bin_len=MAX_FRAME_BYTES,
            max_array_len=MAX_LIST,
            max_map_len=MAX_LIST,
            max_ext_len=0,
        )
    except Exception as e:  # ExtraData, FormatError, StackError, UnicodeDecodeError, ...
        raise WireError(f"not a msgpack frame: {type(e).__name__}: {e}") from None
    if type(obj) is not list or len(obj) < 2:
        raise WireError(f"frame must be an array [version, tag, ...], got {type(obj).__name__}")
    version, tag = obj[0], obj[1]
    if type(version) is not int or version != WIRE_VERSION:
        raise WireError(f"wire version {version!r} != {WIRE_VERSION}")
    cls = REGISTRY.get(tag) if type(tag) is int else None
    if cls is None:
        raise WireError(f"unknown message tag {tag!r}")
    return cls(*_checked_values(cls, obj[2:]))
