"""A rank's shard of each checkpoint tensor, read as a slice where the format allows.

    safetensors     each tensor's slice read from the file (safe_open's get_slice): a
                    rank reads only its rows / columns, never the whole matrix
    GGUF            the float path: each matrix dequantized (gguf_matrices, one at a time)
                    and sliced; the rank keeps float weights of its shard only. Splitting
                    the file's quantized blocks (at block boundaries) is not done yet

By Hugging Face name (the loader stacks q/k/v and gate/up afterwards, with the rank's
local sizes): q/k/v and gate/up rows, o_proj / down_proj input columns (their bias
whole), fused qkv_proj / gate_up_proj (Phi-3) piece by piece, the embeddings' and the
head's vocabulary rows (the last rank's padded with zeros); everything else (norms) whole.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import safe_open

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


def shard_arrays(
    weights: Iterable[tuple[str, Any]], part: Partition, args: ModelArgs
) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, this rank's part) of in-memory tensors or arrays (the GGUF float path)."""
    for name, t in weights:
        yield name, shard_tensor(name, t, list(t.shape), part, args)


def iter_safetensors_shard(
    model_dir: Path, part: Partition, args: ModelArgs
) -> Iterator[tuple[str, torch.Tensor]]:
    """models.iter_safetensors, each tensor read as this rank's slice only."""
    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors weights in {model_dir}")
    for file in files:
        try:
            with safe_open(file, framework="pt") as f:
                for name in f.keys():  # noqa: SIM118 (safe_open is not a dict)
                    sl = f.get_slice(name)
                    yield name, shard_tensor(name, sl, list(sl.get_shape()), part, args)
        except (OSError, ValueError, RuntimeError) as e:
            raise ValueError(f"cannot read weights file {file}: {e}") from e
