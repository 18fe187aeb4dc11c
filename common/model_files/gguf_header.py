"""A GGUF file's header in milliseconds: its metadata scalars and tensor table, without
building its vocabulary.

    GGUF file ──read_header──▶ GGUFHeader(fields: scalars, tensors: gguf.ReaderTensor views
                                            of one memory map)

gguf-py's GGUFReader makes a numpy view of every element of every metadata array, so
opening a file whose vocabulary has 49k tokens (SmolLM2) takes ~2 s on an idle Zen 4 and
Gemma 3's 262k-token one ~8 s, and more on a busy machine. The scheduler opens the file
at every start and needs none of those strings (the conversion cache holds the
tokenizer), so it reads the header here: scalars decoded with struct, arrays skipped by
their lengths (a numeric array in one step, a string array one length at a time) and
kept only as (element type, count), tensors as gguf-py's own ReaderTensor tuples whose
`data` is a view of one numpy memory map, shaped as gguf-py shapes it. The conversion
(common.model_files.gguf_convert), which does need the vocabulary, asks for the arrays
decoded (`arrays=True`: one pass over the strings, no view per element).

The format (GGUF v2/v3, little-endian): magic "GGUF", u32 version, u64 tensor count,
u64 metadata count; each metadata entry a string key, a u32 value type and the value;
each tensor a string name, u32 n_dims, n_dims u64 dims, u32 type, u64 offset from the
data section, which starts at the header's end rounded up to `general.alignment` (32).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from common.model_files.gguf_names import SUPPORTED_GGUF_ARCHS
from common.model_files.model_source import ModelSourceError

# metadata value types: struct format of the scalar ones
_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q"}
_SCALAR |= {11: "<q", 12: "<d"}
STRING, ARRAY = 8, 9
MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32


class GGUFHeaderError(ValueError):
    pass


@dataclass(frozen=True)
class MetaArray:
    """A metadata array, not decoded: its element type and length."""

    item_type: int
    count: int


@dataclass
class GGUFHeader:
    path: Path
    version: int
    fields: dict[str, Any]  # scalars and strings decoded; arrays as MetaArray
    tensors: list[Any]  # gguf.ReaderTensor (field None)

    def get(self, key: str, default: Any = None) -> Any:
        return self.fields.get(key, default)


class _Cursor:
    def __init__(self, buf: memoryview, arrays: bool = False) -> None:
        self.buf, self.pos, self.arrays = buf, 0, arrays

    def take(self, fmt: str) -> Any:
        size = struct.calcsize(fmt)
        if self.pos + size > len(self.buf):
            raise GGUFHeaderError("the header ends early (truncated file)")
        (v,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += size
        return v

    def string(self) -> str:
        n = self.take("<Q")
        if self.pos + n > len(self.buf):
            raise GGUFHeaderError("the header ends early (truncated file)")
        s = bytes(self.buf[self.pos : self.pos + n]).decode("utf-8", errors="replace")
        self.pos += n
        return s

    def strings(self, count: int) -> list[str]:
        buf, out = self.buf, []
        for _ in range(count):
            n = self.take("<Q")
            if self.pos + n > len(buf):
                raise GGUFHeaderError("the header ends early (truncated file)")
            out.append(bytes(buf[self.pos : self.pos + n]).decode("utf-8", errors="replace"))
            self.pos += n
        return out

    def skip_strings(self, count: int) -> None:
        buf, pos, end = self.buf, self.pos, len(self.buf)
        for _ in range(count):
            if pos + 8 > end:
                raise GGUFHeaderError("the header ends early (truncated file)")
            pos += 8 + struct.unpack_from("<Q", buf, pos)[0]
        if pos > end:
            raise GGUFHeaderError("the header ends early (truncated file)")
        self.pos = pos

    def value(self, vtype: int) -> Any:
        if vtype in _SCALAR:
            return self.take(_SCALAR[vtype])
        if vtype == STRING:
            return self.string()
        if vtype == ARRAY:
            item, count = self.take("<I"), self.take("<Q")
            values: list | None = None
            if item == STRING:
                if self.arrays:
                    values = self.strings(count)
                else:
                    self.skip_strings(count)
            elif item in _SCALAR:
                start = self.pos
                self.pos += struct.calcsize(_SCALAR[item]) * count
                if self.pos > len(self.buf):
                    raise GGUFHeaderError("the header ends early (truncated file)")
                if self.arrays:
                    dtype = np.dtype(_SCALAR[item])
                    values = np.frombuffer(self.buf, dtype, count, start).tolist()
            else:  # arrays of arrays: no known model writes them
                raise GGUFHeaderError(f"unsupported metadata array of type {item}")
            return MetaArray(item, count) if values is None else values
        raise GGUFHeaderError(f"unknown metadata value type {vtype}")


def read_header(path: Path | str, arrays: bool = False) -> GGUFHeader:
    """The header of the GGUF file at `path` (GGUFHeaderError if it is not one, is
    big-endian, or ends before its header or tensors do); with `arrays`, metadata arrays
    decoded into lists as GGUFReader's `contents()` gives them (the vocabulary: ~0.1 s
    for 49k tokens, where GGUFReader takes seconds), else kept as MetaArray."""
    import gguf

    path = Path(path)
    mm = np.memmap(path, dtype=np.uint8, mode="r")
    cur = _Cursor(memoryview(mm), arrays)  # type: ignore[arg-type]  # a memmap is a buffer
    if bytes(mm[:4]) != MAGIC:
        raise GGUFHeaderError("not a GGUF file (bad magic)")
    cur.pos = 4
    version = cur.take("<I")
    if version not in (2, 3):
        raise GGUFHeaderError(f"GGUF version {version} is not supported (2 and 3 are)")
    n_tensors, n_kv = cur.take("<Q"), cur.take("<Q")
    fields: dict[str, Any] = {}
    for _ in range(n_kv):
        key = cur.string()
        fields[key] = cur.value(cur.take("<I"))
    infos = []
    for _ in range(n_tensors):
        name = cur.string()
        dims = [cur.take("<Q") for _ in range(cur.take("<I"))]
        infos.append((name, dims, cur.take("<I"), cur.take("<Q")))
    align = int(fields.get("general.alignment", DEFAULT_ALIGNMENT))
    start = -(-cur.pos // align) * align
    tensors, seen = [], set()
    for name, dims, raw_type, offset in infos:
        if name in seen:
            raise GGUFHeaderError(f"tensor {name} appears twice")
        seen.add(name)
        try:
            qtype = gguf.GGMLQuantizationType(raw_type)
        except ValueError:
            raise GGUFHeaderError(f"tensor {name} has an unknown type {raw_type}") from None
        n_elems = int(np.prod(dims)) if dims else 1
        block, type_size = gguf.GGML_QUANT_SIZES[qtype]
        n_bytes = n_elems * type_size // block
        begin = start + offset
        if begin + n_bytes > len(mm):
            raise GGUFHeaderError(f"tensor {name} ends past the end of the file (truncated)")
        np_dims = tuple(reversed(dims))
        dtype = _PLAIN.get(qtype.name)
        if dtype is None:
            view = mm[begin : begin + n_bytes]
            np_dims = gguf.quant_shape_to_byte_shape(np_dims, qtype)
        else:
            view = mm[begin : begin + n_bytes].view(dtype)
        tensors.append(
            gguf.ReaderTensor(
                name=name,
                tensor_type=qtype,
                shape=np.array(dims, dtype=np.uint64),
                n_elements=n_elems,
                n_bytes=n_bytes,
                data_offset=begin,
                data=view.reshape(np_dims),
                field=None,  # type: ignore[arg-type]  # no metadata field behind it
            )
        )
    return GGUFHeader(path, version, fields, tensors)


# the types gguf-py hands out as typed arrays; every other one as its raw bytes
_PLAIN = {
    "F16": np.float16,
    "F32": np.float32,
    "F64": np.float64,
    "I8": np.int8,
    "I16": np.int16,
    "I32": np.int32,
    "I64": np.int64,
}


def gguf_blocks_header(path: Path, arrays: bool = False) -> GGUFHeader:
    """The header and tensor table of a supported GGUF file, its vocabulary skipped
    (~50 ms where GGUFReader takes seconds) or, with `arrays`, decoded."""
    try:
        header = read_header(path, arrays)
    except (GGUFHeaderError, OSError) as e:
        raise ModelSourceError(f"GGUF file {path} is corrupt, truncated or not GGUF: {e}") from e
    check_metadata(path, header.get)
    return header


def check_metadata(path: Path, get: Callable[[str], Any]) -> None:
    """A supported architecture with the metadata the conversion and the engine need."""
    arch = get("general.architecture")
    if arch not in SUPPORTED_GGUF_ARCHS:
        raise ModelSourceError(
            f"GGUF file {path}: architecture {arch!r} is not supported; "
            f"supported GGUF architectures: {', '.join(SUPPORTED_GGUF_ARCHS)}"
        )
    needed = ("block_count", "attention.head_count", "feed_forward_length")
    missing = [f"{arch}.{k}" for k in needed if not isinstance(get(f"{arch}.{k}"), int)]
    if missing:
        raise ModelSourceError(
            f"GGUF file {path} lacks (or has odd) metadata: {', '.join(missing)}"
        )
