"""The embedding read from the GGUF file, not through its map (quant/embedding.py,
quant/mapped.py): the same rows bit for bit, and none of the map's pages resident."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from scheduler_worker.quant.embedding import QuantEmbedding
from scheduler_worker.quant.mapped import drop_map_pages, file_of
from tests.scheduler_worker.test_loader import random_rows


def _mapped(rows: np.ndarray, path, offset: int) -> np.ndarray:
    """`rows` written into a file at `offset`, and the file's map as the header reader
    makes it: one memmap of the whole file, the tensor a reshaped slice of it."""
    with open(path, "wb") as f:
        f.write(b"\x07" * offset + rows.tobytes() + b"\x09" * 100)
    mm = np.memmap(path, dtype=np.uint8, mode="r")
    return np.asarray(mm[offset : offset + rows.nbytes].view(rows.dtype)).reshape(rows.shape)


def _resident(path) -> int:
    """Bytes of the file's maps resident in this process (smaps' Rss: mincore would say
    what the page cache holds)."""
    total, ours = 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            fields = line.split()
            if "-" in fields[0] and len(fields) >= 5 and fields[0][0] in "0123456789abcdef":
                ours = len(fields) > 5 and fields[5] == str(path)
            elif ours and fields[0] == "Rss:":
                total += int(fields[1]) * 1024
    return total


@pytest.mark.parametrize("type_name", ["Q8_0", "Q4_1", "Q6_K", "F32"])
def test_rows_read_from_the_file_equal_the_table(tmp_path, type_name):
    vocab, dim = 300, 256
    if type_name == "F32":
        rows = np.random.default_rng(3).standard_normal((vocab, dim)).astype(np.float32)
    else:
        rows = random_rows(type_name, vocab, dim, seed=3)
    view = _mapped(rows, tmp_path / "t.gguf", 12_345)
    assert file_of(view) == (str(tmp_path / "t.gguf"), 12_345)
    from_file = QuantEmbedding(view, type_name, dim, torch.float32)
    in_memory = QuantEmbedding(rows, type_name, dim, torch.float32)
    assert from_file.table_t is None and from_file.fd >= 0 and in_memory.table_t is not None
    # repeats, runs of consecutive ids, the first and the last row
    ids = torch.tensor([[0, 1, 2, 299, 7, 7], [150, 151, 3, 298, 299, 0]])
    torch.testing.assert_close(from_file(ids), in_memory(ids), rtol=0, atol=0)
    assert from_file.mapped_bytes() == rows.nbytes
    assert from_file.read_rows(np.array([], np.int64)).shape == (0, *rows.shape[1:])
    with pytest.raises(IndexError, match="out of range"):
        from_file(torch.tensor([vocab]))


def test_dropped_map_pages_stay_out_after_lookups(tmp_path):
    rows = random_rows("Q8_0", 4096, 512, seed=4)  # 2.1 MiB
    path = tmp_path / "t.gguf"
    view = _mapped(rows, path, 4096)
    assert int(view.sum()) > 0  # every page read through the map: resident
    assert _resident(path) >= rows.nbytes
    emb = QuantEmbedding(view, "Q8_0", 512, torch.float32)
    assert drop_map_pages([view, view[:10]]) >= rows.nbytes  # the map once
    assert _resident(path) == 0
    emb(torch.arange(4096))
    assert _resident(path) == 0  # the rows came by pread, not through the map
    assert drop_map_pages([rows]) == 0  # an array in memory: nothing to drop
