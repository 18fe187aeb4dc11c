"""common.model_files.gguf_header against gguf-py's own GGUFReader: the same tensors (names, types,
shapes, offsets, bytes, numpy shapes and dtypes), the same metadata scalars, arrays by
type and length (and, decoded, equal to GGUFReader's contents); clear errors on files
that are not GGUF or end early."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest

from common.model_files.gguf_header import GGUFHeaderError, MetaArray, read_header
from common.model_files.model_source import default_gguf_path


def same_as_gguf_py(path: Path) -> None:
    header, reader = read_header(path), gguf.GGUFReader(str(path))
    assert [t.name for t in header.tensors] == [t.name for t in reader.tensors]
    for a, b in zip(header.tensors, reader.tensors, strict=True):
        assert (a.tensor_type, list(a.shape), a.n_bytes, a.data_offset) == (
            b.tensor_type,
            list(b.shape),
            b.n_bytes,
            b.data_offset,
        ), a.name
        assert (a.data.shape, a.data.dtype) == (b.data.shape, b.data.dtype), a.name
        assert np.array_equal(a.data, b.data), a.name
    keys = [k for k in reader.fields if not k.startswith("GGUF.")]
    assert sorted(keys) == sorted(header.fields)
    decoded = read_header(path, arrays=True).fields  # the conversion's: arrays as lists
    for key in keys:
        got, want = header.fields[key], reader.fields[key]
        if isinstance(got, MetaArray):
            assert got.count == len(want.data), key
            assert isinstance(decoded[key], list) and decoded[key] == want.contents(), key
        else:
            assert got == want.contents() == decoded[key], key


@pytest.fixture
def small_gguf(tmp_path) -> Path:
    """Every metadata kind (scalars, strings, string and numeric arrays, a custom
    alignment) and plain and block-quantized tensors, written by gguf-py."""
    path = tmp_path / "small.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_custom_alignment(64)
    w.add_block_count(2)
    w.add_float32("x.f32", 0.5)
    w.add_bool("x.bool", True)
    w.add_int64("x.i64", -(2**40))
    w.add_string("x.str", "héllo")
    w.add_array("x.strs", ["a", "", "ünï", "long" * 50])
    w.add_array("x.ints", [1, 2, 3])
    w.add_array("x.floats", [0.25, -1.0])
    rng = np.random.default_rng(0)
    w.add_tensor("a.f32", rng.standard_normal((3, 5)).astype(np.float32))
    w.add_tensor("b.f16", rng.standard_normal((7,)).astype(np.float16))
    q8 = gguf.quants.quantize(
        rng.standard_normal((4, 64)).astype(np.float32), gguf.GGMLQuantizationType.Q8_0
    )
    w.add_tensor("c.q8", q8, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_a_written_file_reads_as_gguf_py_reads_it(small_gguf):
    same_as_gguf_py(small_gguf)
    header = read_header(small_gguf)
    assert header.fields["x.strs"] == MetaArray(8, 4)
    assert header.fields["x.str"] == "héllo"


def test_the_default_model_reads_as_gguf_py_reads_it():
    same_as_gguf_py(default_gguf_path())


@pytest.mark.parametrize("cut", [3, 20, 200, -100])
def test_a_file_that_ends_early_is_refused(small_gguf, tmp_path, cut):
    data = small_gguf.read_bytes()
    bad = tmp_path / "cut.gguf"
    bad.write_bytes(data[:cut])  # -100: inside the last tensor (272 bytes)
    with pytest.raises(GGUFHeaderError, match="truncated|magic"):
        read_header(bad)


def test_not_gguf_and_other_versions_are_refused(small_gguf, tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGML" + small_gguf.read_bytes()[4:])
    with pytest.raises(GGUFHeaderError, match="not a GGUF file"):
        read_header(bad)
    data = bytearray(small_gguf.read_bytes())
    data[4:8] = (7).to_bytes(4, "little")
    bad.write_bytes(bytes(data))
    with pytest.raises(GGUFHeaderError, match="version 7"):
        read_header(bad)
