"""Logits processors: what a batch's logits go through before sampling, each
vectorized over the rows that need it, in this order (`Sampler.sample`):

    grammar mask (`apply_token_masks`, constrained rows)
    ─▶ min_tokens mask (`mask_stop_tokens`: EOS + stop ids)
    ─▶ logit_bias (`apply_logit_bias`: added; -inf stays -inf, the grammar wins)
    ─▶ repetition penalty, then presence/frequency penalties
       (`scheduler_worker.penalties.apply_penalties`)

A batch of plain greedy rows takes the grammar mask alone. Each returns its input
when no row needs it, else a copy (the grammar mask and the penalties may write in
place); the rows that need nothing are unchanged. Host lists reach the device through pinned memory,
non-blocking (`_to`, `_tensor`: the sampler's too).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain, compress, repeat
from operator import attrgetter, is_not
from typing import Protocol

import numpy as np
import torch

from common.sampling_params import SamplingParams
from scheduler_worker.backends.base import MaskRows
from scheduler_worker.backends.device import to_device
from scheduler_worker.penalty_counts import flat_index


class SampledRow(Protocol):
    """A row as the sampler reads it. A request is its own row
    (scheduler_worker.request.Request: nothing is copied a step); SamplingRow is one made
    by hand (a verify chunk's positions, tests, benchmarks)."""

    @property
    def params(self) -> SamplingParams: ...
    @property
    def prompt_token_ids(self) -> Sequence[int]: ...
    @property
    def output_token_ids(self) -> Sequence[int]: ...
    # overlapped scheduling: the row of the step in flight whose token is this row's last
    # output (a placeholder in output_token_ids), read on the device; -1: none
    @property
    def pending_row(self) -> int: ...
    # structured outputs: the grammar's packed bitmask, int32 [ceil(vocab / 32)], bit j of
    # word w set where token 32 w + j is allowed (scheduler_worker.structured)
    @property
    def token_bitmask(self) -> torch.Tensor | None: ...
    # speculative decoding: the drafts before this position of a verify chunk (spec/
    # sampled.py), output tokens as far as its sample goes (seed counter, min_tokens, penalties)
    @property
    def draft_token_ids(self) -> Sequence[int]: ...
    # its request's slot (Request.slot): its parameters' kinds kept there; -1: none
    @property
    def slot(self) -> int: ...


@dataclass(eq=False)  # rows compare by identity (Sampler._batch keeps the last step's)
class SamplingRow:
    """A SampledRow made by hand (the protocol above says what each field is)."""

    params: SamplingParams
    prompt_token_ids: Sequence[int]
    output_token_ids: Sequence[int]
    pending_row: int = -1
    token_bitmask: torch.Tensor | None = None
    draft_token_ids: Sequence[int] = ()
    slot: int = -1


Rows = Sequence[SampledRow]

# attrgetter passes for a step's few rows (penalties, seeds); a pass over all of them is a
# list comprehension (an attrgetter pass took ~2x as long: docs/benchmarks.md, "The host
# step in instructions")
_SLOT, _DRAFTS, _PARAMS, _OUTPUT_IDS = (
    attrgetter("slot"),
    attrgetter("draft_token_ids"),
    attrgetter("params"),
    attrgetter("output_token_ids"),
)


def _tensor(values: Sequence, device: torch.device, dtype: torch.dtype | None = None):
    return to_device(torch.tensor(values, dtype=dtype), device)


def _array(values: np.ndarray, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """A numpy column as _tensor makes a list (a float64 one as float32, rounded alike)."""
    return to_device(torch.from_numpy(np.ascontiguousarray(values)).to(dtype), device)


class DeviceColumns:
    """The sampler's per-row columns on the device (a step's temperatures, top_p, the rows
    that draw, the penalized rows, ...), each kept under its name while its values stay
    the same: an overlapped decode batch holds the same rows with the same parameters most
    steps, so its columns reach the device once, not each step (on a GPU each fresh one is
    a pinned staging copy, an H2D copy and a cast: docs/benchmarks.md, "Host step, eleventh
    session"). A column is checked against the values it was made from (a compare in C),
    so a stale one is never read; the tensors given out are never written."""

    def __init__(self) -> None:
        self._kept: dict[str, tuple[np.ndarray | list, torch.Tensor]] = {}
        self.reused = 0  # columns read from _kept (tests, benchmarks)

    def get(
        self,
        name: str,
        values: np.ndarray | list,
        device: torch.device,
        dtype: torch.dtype,
    ) -> torch.Tensor:
        kept = self._kept.get(name)
        if kept is not None:
            host, t = kept
            if t.device == device and t.dtype == dtype and _same(host, values):
                self.reused += 1
                return t
        host = values.copy() if isinstance(values, np.ndarray) else list(values)
        t = _fresh(host, device, dtype)  # from the copy: no caller's write reaches it
        self._kept[name] = (host, t)
        return t


def _same(host: np.ndarray | list, values: np.ndarray | list) -> bool:
    if isinstance(host, list):
        return isinstance(values, list) and host == values
    return (
        isinstance(values, np.ndarray)
        and host.shape == values.shape
        and host.dtype == values.dtype
        and bool((host == values).all())
    )


def _column(
    cols: DeviceColumns | None,
    name: str,
    values: np.ndarray | list,
    device: torch.device,
    dtype: torch.dtype,
) -> torch.Tensor:
    """values on the device: kept in `cols` under `name`, or made now (no cols)."""
    if cols is not None:
        return cols.get(name, values, device, dtype)
    return _fresh(values, device, dtype)


def _fresh(values: np.ndarray | list, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    if isinstance(values, np.ndarray):
        return _array(values, device, dtype)
    return _tensor(values, device, dtype)


def _flat_index(seqs: Sequence[Sequence[int]], vocab: int, device: torch.device) -> torch.Tensor:
    """flat_index on the device; a placeholder (-1: the token the step in flight is
    sampling) is counted apart (`_in_flight`)."""
    return to_device(torch.from_numpy(flat_index(seqs, vocab)), device)


def mask_stop_tokens(
    logits: torch.Tensor,
    rows: Rows,
    eos_token_ids: Sequence[int],
    idx: Sequence[int] | None = None,
) -> torch.Tensor:
    """EOS and stop ids get -inf in rows that have fewer than min_tokens outputs (idx: the
    rows with min_tokens, where known)."""
    vocab = logits.shape[1]
    flat: list[int] = []
    for i in range(len(rows)) if idx is None else idx:
        r = rows[i]
        if len(r.output_token_ids) + len(r.draft_token_ids) < r.params.min_tokens:
            stop = chain(eos_token_ids, r.params.stop_token_ids)
            flat += [i * vocab + t for t in stop if t < vocab]
    if not flat:
        return logits
    logits = logits.clone(memory_format=torch.contiguous_format)
    logits.view(-1).index_fill_(0, _tensor(flat, logits.device), float("-inf"))
    return logits


def apply_token_masks(
    logits: torch.Tensor,
    rows: Rows,
    isa: int | None = None,
    in_place: bool = False,
    masked: Sequence[int] | None = None,
    op: MaskRows | None = None,
) -> torch.Tensor:
    """-inf where a constrained row's grammar forbids the token: into `logits` when
    in_place (and they are contiguous), else into a copy. With the C++ kernels (`isa`:
    their path) a float32 CPU batch takes one op straight from the packed words (this runs
    on the decode critical path, between the forward and the sample); so does a batch on
    the device of the backend's `op` (a GPU's Triton launch); else the words are expanded
    to bools in torch, on the logits' device. `masked`: the rows that may carry a mask,
    where the caller knows them (the engine: the rows it gave one); else all."""
    if masked is None:
        masks = [row.token_bitmask for row in rows]
    else:
        masks = [rows[i].token_bitmask for i in masked]
    at = list(compress(range(len(masks)), map(is_not, masks, repeat(None))))
    if not at:
        return logits
    idx = at if masked is None else [masked[i] for i in at]
    if in_place and logits.is_contiguous():
        out = logits  # a copy of [32, 49152] float32 cost ~0.5 ms a step, from DRAM
    else:
        out = logits.clone(memory_format=torch.contiguous_format)
    words = [w for w in masks if w is not None]  # the rows of idx, in order
    if isa is not None and out.dtype == torch.float32:  # isa: the CPU backend's
        torch.ops.zeroserve.token_bitmask_(out, idx, [w.cpu() for w in words], isa)
        return out
    vocab = out.shape[1]
    # the words the logits reach, alone (a grammar's words cover its tokenizer's vocabulary)
    packed = to_device(torch.stack(words)[:, : -(-vocab // 32)], out.device)
    if op is not None and op.device == out.device.type:
        op.fn(out, _tensor(idx, out.device), packed)
        return out
    forbidden = ((packed.unsqueeze(-1) & _bit_values(out.device)) == 0).view(len(idx), -1)
    forbidden = forbidden[:, :vocab]
    if forbidden.shape[1] < vocab:  # tokens beyond the words' 32 W: forbidden
        forbidden = torch.nn.functional.pad(forbidden, (0, vocab - forbidden.shape[1]), value=True)
    rows_t = _tensor(idx, out.device)
    cut = out.index_select(0, rows_t).masked_fill_(forbidden, float("-inf"))
    return out.index_copy_(0, rows_t, cut)


_BIT_VALUES: dict[torch.device, torch.Tensor] = {}


def _bit_values(device: torch.device) -> torch.Tensor:
    """int32 [32]: bit j's value (1 << j; bit 31's is negative), kept per device: a mask's
    words unpack in two ops (&, == 0), not four with a fresh arange."""
    bits = _BIT_VALUES.get(device)
    if bits is None:
        values = np.left_shift(np.uint32(1), np.arange(32, dtype=np.uint32)).view(np.int32)
        bits = _BIT_VALUES[device] = torch.from_numpy(values).to(device)
    return bits


def apply_logit_bias(
    logits: torch.Tensor, rows: Rows, idx: Sequence[int] | None = None
) -> torch.Tensor:
    """Each row's logit_bias added to its tokens' logits, in one index_add_ over the batch
    (ids past the logits' width are skipped: validated ones never are). Returns a new
    tensor when some row has a bias (idx: those rows, where known); the others' rows are
    unchanged."""
    vocab = logits.shape[1]
    flat: list[int] = []
    bias: list[float] = []
    for i in range(len(rows)) if idx is None else idx:
        for t, b in (rows[i].params.logit_bias or {}).items():
            if t < vocab:
                flat.append(i * vocab + t)
                bias.append(b)
    if not flat:
        return logits
    logits = logits.clone(memory_format=torch.contiguous_format)
    dev = logits.device
    logits.view(-1).index_add_(0, _tensor(flat, dev), _tensor(bias, dev, logits.dtype))
    return logits
