"""QuantEmbedding: the token embedding table left in the GGUF file, rows dequantized on
lookup.

    GGUF memory map ── token_embd rows [vocab, row bytes] (file pages, read on demand)
          ids ──▶ rows[ids] (a copy of those rows' bytes) ──dequantize_rows──▶ [T, hidden]

The table is a view of the file's memory map (gguf.GGUFReader's numpy memmap): the
process holds no copy of it, and the pages of the rows looked up stay in the page cache,
shared and reclaimable. A step looks up one row per token, so the dequantization is of a
few rows, not the table. A tied output head is a separate QuantLinear over the same
tensor in the kernels' layout.
"""

from __future__ import annotations

import warnings

import numpy as np
import torch
from torch import nn

from scheduler_worker.quant.dequant_linear import dequantize_rows, torch_rows


class QuantEmbedding(nn.Module):
    def __init__(self, rows: np.ndarray, type_name: str, dim: int, dtype: torch.dtype) -> None:
        """`rows`: the file's tensor as [vocab, row bytes] (or [vocab, dim] floats), a view
        of the memory map."""
        super().__init__()
        self.table = rows  # not a buffer: file-backed, never copied into the process
        with warnings.catch_warnings():  # read-only map: the table is never written
            warnings.simplefilter("ignore", UserWarning)
            self.table_t = torch.from_numpy(rows)  # the same pages, for index_select
        self.num_embeddings, self.embedding_dim = rows.shape[0], dim
        self.source, self.dtype = type_name, dtype

    def mapped_bytes(self) -> int:
        return int(self.table.nbytes)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        flat = ids.reshape(-1).cpu()
        if flat.numel() and (int(flat.min()) < 0 or int(flat.max()) >= self.num_embeddings):
            raise IndexError(f"token id out of range for a vocabulary of {self.num_embeddings}")
        picked = self.table_t.index_select(0, flat)  # a copy of those rows' bytes
        rows = torch_rows(picked, self.source, self.embedding_dim)
        if rows is None:  # other types: gguf-py's numpy dequantization
            rows = dequantize_rows(picked.numpy(), self.source, self.embedding_dim)
        return rows.to(self.dtype).reshape(*ids.shape, self.embedding_dim)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, {self.source} rows from the file"
