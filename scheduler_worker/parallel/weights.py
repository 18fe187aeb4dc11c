"""A rank's shard of each checkpoint tensor, read as a slice where the format allows.

    safetensors     each tensor's slice read from the file (safe_open's get_slice): a
                    rank reads only its rows / columns, never the whole matrix
    GGUF            the file's quantized rows sliced, and its columns at block boundaries
                    (a split inside a block: the rows dequantized whole, then cut), before
                    they are dequantized: a rank dequantizes about its shard only, and
                    keeps float weights of it (serving the shard from the quantized blocks
                    themselves, as the one-process CPU path does, is not done yet)

By Hugging Face name (the loader stacks q/k/v and gate/up afterwards, with the rank's
local sizes): q/k/v and gate/up rows, o_proj / down_proj input columns (their bias
whole), fused qkv_proj / gate_up_proj (Phi-3) piece by piece, the embeddings' and the
head's vocabulary rows (the last rank's padded with zeros); everything else (norms) whole.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from scheduler_worker.models import iter_safetensors
from scheduler_worker.models.common import ModelArgs
from scheduler_worker.parallel.partition import Partition

ROWS = {"q_proj": "q", "k_proj": "k", "v_proj": "v", "gate_proj": "gate", "up_proj": "up"}
COLUMNS = {"o_proj": "o", "down_proj": "down"}
VOCAB = ("embed_tokens", "lm_head")


def _rows(t: Any, start: int, stop: int) -> torch.Tensor:
    return _tensor(t[start:stop])


def _tensor(x: Any) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(x)) if isinstance(x, np.ndarray) else x


def shard_tensor(name: str, t: Any, shape: list[int], part: Partition, args: ModelArgs):
    """This rank's part of checkpoint tensor `name` (`t` sliceable: a safetensors slice,
    an array or a tensor, of `shape`); `args` the whole model's."""
    parts = name.split(".")
    piece, kind = (parts[-2], parts[-1]) if len(parts) >= 2 else ("", "")
    if piece in ROWS:
        return _rows(t, *part.rows(ROWS[piece]))
    if piece in COLUMNS:
        if kind == "bias":
            return _tensor(t[:])
        start, stop = part.rows(COLUMNS[piece])
        return _tensor(t[:, start:stop])
    if piece == "qkv_proj":  # fused [q; k; v] rows
        q_size, kv_size = args.num_heads * args.head_dim, args.num_kv_heads * args.head_dim
        offsets = {"q": 0, "k": q_size, "v": q_size + kv_size}
        return _fused(t, [(offsets[p], part.rows(p)) for p in ("q", "k", "v")])
    if piece == "gate_up_proj":  # fused [gate; up] rows
        size = args.intermediate_size
        return _fused(t, [(0, part.rows("gate")), (size, part.rows("up"))])
    if piece in VOCAB and kind == "weight":
        start, stop = part.vocab
        rows = _rows(t, start, stop)
        if rows.shape[0] == part.vocab_rows:
            return rows
        padded = rows.new_zeros((part.vocab_rows, *shape[1:]))
        padded[: rows.shape[0]] = rows
        return padded
    return _tensor(t[:])


def _fused(t: Any, pieces: list[tuple[int, tuple[int, int]]]) -> torch.Tensor:
    return torch.cat([_rows(t, base + a, base + b) for base, (a, b) in pieces])


class GGUFMatrix:
    """A GGUF matrix (HF shape [rows, cols]) that dequantizes only the part asked for:
    m[a:b] (rows), m[:, a:b] (columns: whole blocks where a and b fall on block
    boundaries), m[:] (all)."""

    def __init__(self, raw: np.ndarray, qtype: Any) -> None:
        from gguf import GGML_QUANT_SIZES

        self.raw, self.qtype = raw, qtype
        self.block, self.block_bytes = GGML_QUANT_SIZES[qtype]
        self.packed = raw.dtype == np.uint8 and self.block_bytes != 1  # rows of blocks
        cols = raw.shape[1] // self.block_bytes * self.block if self.packed else raw.shape[1]
        self.shape = [raw.shape[0], cols]

    def _dequantize(self, part: np.ndarray) -> torch.Tensor:
        from gguf.quants import dequantize

        w = dequantize(np.ascontiguousarray(part), self.qtype).astype(np.float32, copy=False)
        return torch.from_numpy(np.require(w, requirements=["C", "W"]))

    def __getitem__(self, key: Any) -> torch.Tensor:
        rows, cols = key if isinstance(key, tuple) else (key, slice(None))
        part = self.raw[rows]
        if cols == slice(None):
            return self._dequantize(part)
        a, b = cols.start, cols.stop
        if not self.packed:
            return self._dequantize(part[:, a:b])
        if a % self.block or b % self.block:
            return self._dequantize(part)[:, a:b].contiguous()
        per = self.block_bytes
        return self._dequantize(part[:, a // self.block * per : b // self.block * per])


def gguf_shards(path: Path, part: Partition, args: ModelArgs) -> Iterator[tuple[str, torch.Tensor]]:
    """gguf_convert.gguf_matrices, each matrix cut to this rank's part before it is
    dequantized (llama.cpp's q/k row permutation undone on the rows of blocks first)."""
    from common.families import gguf_spec
    from common.model_files.gguf_convert import is_matrix, unpermute
    from common.model_files.gguf_header import gguf_blocks_header
    from common.model_files.gguf_names import hf_name
    from common.model_files.model_source import ModelSourceError

    reader = gguf_blocks_header(Path(path))
    arch = reader.get("general.architecture")
    permuted = gguf_spec(arch).qk_permuted
    for t in reader.tensors:
        if not is_matrix(t):
            continue
        name = hf_name(t.name, arch)
        if name is None:
            raise ModelSourceError(f"GGUF file {path}: unexpected tensor {t.name}")
        raw = t.data
        if permuted and (".q_proj." in name or ".k_proj." in name):
            raw = unpermute(raw, args.num_heads if ".q_proj." in name else args.num_kv_heads)
        m = GGUFMatrix(raw, t.tensor_type)
        yield name, shard_tensor(name, m, m.shape, part, args)


def iter_safetensors_shard(
    model_dir: Path, part: Partition, args: ModelArgs
) -> Iterator[tuple[str, torch.Tensor]]:
    """models.iter_safetensors, each tensor read as this rank's slice only."""

    def read(f: Any, name: str) -> torch.Tensor:
        sl = f.get_slice(name)
        return shard_tensor(name, sl, list(sl.get_shape()), part, args)

    return iter_safetensors(model_dir, read)
