"""QuantEmbedding: the token embedding table left in the GGUF file, rows read from the
file and dequantized on lookup.

    GGUF file ── token_embd rows [vocab, row bytes] ──pread (the ids' rows)──▶ [T, row bytes]
          ──dequantize_rows──▶ [T, hidden]

The process holds no copy of the table, nor a map of it: the rows looked up are read
with pread(2) (one read per run of consecutive ids), so they stay in the page cache,
shared and reclaimable, and not in the process's resident set, which a map's pages
would join and stay in (a tied head already holds the same bytes repacked). A step looks
up one row per token, so the dequantization is of a few rows, not the table. A table
that is not a view of a file's map (tests, a copy) is indexed in memory.
"""

from __future__ import annotations

import os
import warnings
import weakref

import numpy as np
import torch
from torch import nn

from scheduler_worker.quant.dequant_linear import dequantize_rows, torch_rows
from scheduler_worker.quant.mapped import file_of


class QuantEmbedding(nn.Module):
    def __init__(self, rows: np.ndarray, type_name: str, dim: int, dtype: torch.dtype) -> None:
        """`rows`: the file's tensor as [vocab, row bytes] (or [vocab, dim] floats), a view
        of the file's memory map (read from the file from then on) or an array."""
        super().__init__()
        self.num_embeddings, self.embedding_dim = rows.shape[0], dim
        self.source, self.dtype = type_name, dtype
        self.row_shape, self.row_dtype = rows.shape[1:], rows.dtype
        self.row_bytes, self.nbytes = int(rows.nbytes) // max(1, rows.shape[0]), int(rows.nbytes)
        where = file_of(rows)
        self.table_t: torch.Tensor | None = None
        self.fd, self.offset = -1, 0
        if where is None:
            with warnings.catch_warnings():  # a read-only array: the table is never written
                warnings.simplefilter("ignore", UserWarning)
                self.table_t = torch.from_numpy(rows)
        else:
            path, self.offset = where
            self.fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
            weakref.finalize(self, os.close, self.fd)
            if hasattr(os, "posix_fadvise"):  # rows by id: no readahead around them
                os.posix_fadvise(self.fd, self.offset, self.nbytes, os.POSIX_FADV_RANDOM)

    def mapped_bytes(self) -> int:
        """The table's bytes, left in the file (not held by the process)."""
        return self.nbytes

    def read_rows(self, ids: np.ndarray) -> np.ndarray:
        """The table's rows `ids` as stored, read from the file: each distinct id once,
        one pread per run of consecutive ids."""
        uniq, inverse = np.unique(ids, return_inverse=True)
        buf = np.empty((len(uniq), self.row_bytes), np.uint8)
        cuts = [0, *(np.flatnonzero(np.diff(uniq) != 1) + 1).tolist(), len(uniq)]
        for a, b in zip(cuts, cuts[1:]):
            if a == b:  # no ids
                continue
            view, at = buf[a:b].reshape(-1).data, self.offset + int(uniq[a]) * self.row_bytes
            while len(view):  # a read may stop short (a huge run, a signal)
                got = os.preadv(self.fd, [view], at)
                if got <= 0:
                    raise OSError(f"embedding rows {uniq[a]}..{uniq[b - 1]}: the file ends")
                view, at = view[got:], at + got
        return buf[inverse].view(self.row_dtype).reshape(len(ids), *self.row_shape)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        flat = ids.reshape(-1).cpu()
        if flat.numel() and (int(flat.min()) < 0 or int(flat.max()) >= self.num_embeddings):
            raise IndexError(f"token id out of range for a vocabulary of {self.num_embeddings}")
        if self.table_t is not None:
            picked = self.table_t.index_select(0, flat)  # a copy of those rows' bytes
        else:
            picked = torch.from_numpy(self.read_rows(flat.numpy()))
        rows = torch_rows(picked, self.source, self.embedding_dim)
        if rows is None:  # other types: gguf-py's numpy dequantization
            rows = dequantize_rows(picked.numpy(), self.source, self.embedding_dim)
        return rows.to(self.dtype).reshape(*ids.shape, self.embedding_dim)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, {self.source} rows from the file"
