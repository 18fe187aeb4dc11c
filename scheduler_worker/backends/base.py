"""The device backend's interface: what differs between a CPU and a GPU.

    ModelRunner ── owns ──▶ Backend
                             ├─ ops            the layers' op set (backends/ops.py)
                             ├─ kv_cache_dtype / allocate_kv_pool / profile_kv_blocks
                             ├─ prepare(seqs)  step inputs + AttentionMetadata, in its buffers
                             ├─ start(...)     after the KV pool: CUDA graph capture
                             └─ execute(...)   one forward: eager, or a captured graph replayed

The engine loop, the scheduler and the models are written once; a backend is chosen by the
device (backends/select.py). `execute` never waits for the device: it returns the step's
logits (or greedy tokens) as device tensors, so that the engine can prepare the next step
while this one runs (engine.py, overlapped scheduling).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from scheduler_worker.attention import AttentionMetadata
from scheduler_worker.backends.block_tables import BlockTables
from scheduler_worker.backends.device import to_device
from scheduler_worker.backends.device_clock import DeviceClock
from scheduler_worker.backends.int_columns import int64_array
from scheduler_worker.backends.ops import TORCH_OPS, TorchOps
from scheduler_worker.backends.staging import take_placeholders

KVCache = tuple[torch.Tensor, torch.Tensor]


@dataclass(frozen=True)
class DrawRows:
    """A step's draw in one op (draws.kernel_sample): fn(processed logits [R, V] f32, draw
    [R] i64 (-1: the argmax, else the row's index among the drawing rows), params [R, 4] f64
    (temperature, top_k, top_p, min_p), and for the drawing rows their uniforms [D, n] f32
    or, `keyed`, their keys [D] i64 (seeded_uniforms.row_keys: the op makes the uniforms))
    -> tokens [R] i64, on the logits' device. `device`: the device type fn takes tensors
    on (Sampler.draw_op gives it only for logits there)."""

    fn: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
    keyed: bool = False
    device: str = "cpu"


@dataclass(frozen=True)
class PenalizeRows:
    """A step's penalties in one op (penalties.apply_penalties, the counts kept per slot):
    fn(logits [R, V'] f32, written in place, rows [k] i64, entries [k] i64, counts [E, V]
    f32, seen [E, V] bool, pending [k] i64, prev_tokens [P] i64, nums [k, 3] f32, flags;
    flags & 8: each token in flight added to `counts` too), as kernels/csrc/penalize_rows.cpp
    defines it, on tensors of the device type `device`."""

    fn: Callable[..., None]
    device: str = "cpu"


@dataclass(frozen=True)
class MaskRows:
    """A step's grammar masks in one op (logits_processors.apply_token_masks): fn(logits
    [R, V] f32 or bf16, written in place, rows [k] i64, words [k, W] i32: each row's packed
    bitmask, a row stride apart) -> None, as backends/triton_masks.py defines it, on
    tensors of the device type `device`."""

    fn: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], None]
    device: str = "cpu"


@dataclass(slots=True)
class SeqInput:
    token_ids: list[int]  # tokens to compute this step (1 for a decode); -1: see below
    num_computed: int  # tokens of this sequence already in the KV cache
    block_table: list[int]  # must cover num_computed + len(token_ids) tokens
    sample: bool = True  # compute logits for the last token (False: a mid-prompt chunk)
    # logits of this many leading tokens as well (prompt logprobs; execute_with_prompt_logits)
    prompt_logits: int = 0
    # overlapped scheduling: a decode whose token the step in flight is still sampling has
    # token_ids [-1] and here that step's row of it (the token is read on the device)
    prev_row: int = -1
    slot: int = -1  # its row of the scheduler's BlockTables (-1: none, a step built by hand)
    draft: bool = False  # its prompt_logits verify drafts: their argmax will do
    verify: bool = False  # a drafted row, [its last token, drafts...] (spec/verify_rows.py)

    def slots(self, block_size: int) -> list[int]:
        """The cache slot of each of this step's tokens (positions num_computed ...);
        ValueError when the block table does not cover them."""
        start, end, table = (
            self.num_computed,
            self.num_computed + len(self.token_ids),
            self.block_table,
        )
        if len(table) * block_size < end:
            raise ValueError(f"block table covers {len(table) * block_size} tokens, need {end}")
        return [table[p // block_size] * block_size + p % block_size for p in range(start, end)]


@dataclass(slots=True)
class DecodeRows:
    """A decode-only step as columns, every row sampled: row i computes one token at
    positions[i] over the blocks of row slots[i] of `tables`. The engine builds it in a few
    C-level passes where a SeqInput a row cost more than the rest of the row's staging
    (docs/benchmarks.md, "Host step"); a path that reads rows one by one takes seqs()."""

    token_ids: list[int]  # -1: a placeholder, the step in flight's token of prev_rows[i]
    positions: list[int]
    slots: list[int]
    prev_rows: list[int]
    tables: BlockTables
    known: int = -1  # how many rows' tokens are known (prev_rows -1), where counted
    _positions: tuple[list[int], np.ndarray] | None = None  # (positions, as int64)

    def num_known(self) -> int:
        """The rows whose token is known (no placeholder): most overlapped steps none."""
        return self.known if self.known >= 0 else self.prev_rows.count(-1)

    def position_array(self) -> np.ndarray:
        """positions [n] int64, made once for the list they are (int64_array; a list put
        in their place is converted again)."""
        if self._positions is None or self._positions[0] is not self.positions:
            self._positions = (self.positions, int64_array(self.positions))
        return self._positions[1]

    def __len__(self) -> int:
        return len(self.positions)

    @classmethod
    def of(cls, seqs: list[SeqInput], pad: int) -> DecodeRows:
        """Decode SeqInputs (one token each, sampled) as columns over tables of their own."""
        width = max(len(s.block_table) for s in seqs)
        tables = BlockTables(len(seqs), pad, width=max(1, width))
        for s in seqs:
            tables.write(tables.take(), 0, s.block_table)
        return cls(
            [s.token_ids[0] for s in seqs],
            [s.num_computed for s in seqs],
            list(range(len(seqs))),
            [s.prev_row for s in seqs],
            tables,
        )

    def seqs(self) -> list[SeqInput]:
        """The rows as SeqInputs."""
        rows = zip(self.token_ids, self.positions, self.slots, self.prev_rows)
        return [SeqInput([t], p, self.tables.row(s), True, 0, r, s) for t, p, s, r in rows]

    def staged(
        self, bs: int, width: int, out: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """positions [n], block tables [n, width] (past a row's blocks: the tables' pad;
        written into `out` where given, the staging buffer's) and cache slots [n], as
        int64; ValueError when a row's table does not cover its token."""
        pos, idx = self._covered(bs)
        have = min(width, self.tables.width)
        tables = np.empty((len(pos), width), dtype=np.int64) if out is None else out
        tables[:, :have] = self.tables.array[idx, :have]
        tables[:, have:] = self.tables.pad
        slots = tables[np.arange(len(pos)), pos // bs] * bs + pos % bs
        return pos, tables, slots

    def staged_slots(self, bs: int) -> tuple[np.ndarray, np.ndarray]:
        """staged's positions and cache slots without the tables (a reader that holds
        them already), the same check."""
        pos, idx = self._covered(bs)
        return pos, self.tables.array[idx, pos // bs].astype(np.int64) * bs + pos % bs

    def _covered(self, bs: int) -> tuple[np.ndarray, np.ndarray]:
        pos = self.position_array()
        idx = int64_array(self.slots)
        if (pos // bs >= self.tables.lengths[idx]).any():
            raise ValueError("a decode row's block table does not cover its token")
        return pos, idx


StepInputs = list[SeqInput] | DecodeRows


def decode_only(seqs: StepInputs) -> bool:
    """Every row computes one token and samples it (a decode graph's step)."""
    return isinstance(seqs, DecodeRows) or all(len(s.token_ids) == 1 and s.sample for s in seqs)


def step_order(seqs: list[SeqInput]) -> list[int]:
    """The order of the sequences' tokens in a step: decodes (one token) first."""
    return sorted(range(len(seqs)), key=lambda i: len(seqs[i].token_ids) != 1)


class Backend:
    """The generic part: eager execution of whatever `prepare` builds."""

    name = "base"
    ops: TorchOps = TORCH_OPS
    # a drafted row's verify runs as 1 + k decode rows (spec/verify_rows.py), not as a chunk
    verify_as_decode_rows = False
    overlap = False  # execute() returns before the device is done (a GPU)
    # what the runner, the sampler and the status beats read of any backend
    kernel_isa: str | None = None  # the C++ kernels' path (a CPU); None: none
    isa_index = 0  # its index (kernels.isa_index), passed to the C++ ops
    clock: DeviceClock | None = None  # the forwards' device time (a GPU)
    # the sampler's draw as one op on the device (a GPU: triton_sample.sample_rows_keyed); None:
    # the C++ op where host_ops_isa has the kernels, else the sampler's torch path
    draw_rows: DrawRows | None = None
    penalize_rows: PenalizeRows | None = None  # the penalties' one op, likewise (a GPU's)
    mask_rows: MaskRows | None = None  # the grammar masks' one op, likewise (a GPU's)
    _decode_kernel: str | None = None

    @property
    def decode_kernel(self) -> str:
        """The decode attention's name: the CPU's choice (attention.choose_decode_kernel),
        else its op set's."""
        return self._decode_kernel or self.ops.name

    @decode_kernel.setter
    def decode_kernel(self, name: str) -> None:
        self._decode_kernel = name

    @property
    def host_ops_isa(self) -> int | None:
        """isa_index for the C++ ops on host tensors beside the forward (the sampler's
        grammar masks, the drafts' targets), or None where the backend runs no C++ kernels
        (a GPU, --kernels torch): they take torch's path."""
        return None if self.kernel_isa is None else self.isa_index

    def __init__(self, device: torch.device, dtype: torch.dtype, block_size: int) -> None:
        self.device, self.dtype, self.block_size = device, dtype, block_size
        self.facts: dict[str, float] = {}  # logged and exported: memory, capture
        self.prev_tokens: torch.Tensor | None = None  # the step in flight's sampled tokens
        self.chained = False  # this step launches while the one before it is in flight

    def placement(self, ranks: int = 1) -> tuple[str, list[str]]:
        """Where the replica runs, for its beats and its log line: ("cpu", []), or a GPU's
        name and the ids of its `ranks` GPUs as its launcher named them."""
        return self.device.type, []

    def release_cached_memory(self) -> None:
        """The allocator's cached device memory given back (after a step ran out of it)."""

    # ---- the KV pool ----------------------------------------------------------
    def kv_cache_dtype(self, want: str) -> torch.dtype:
        raise NotImplementedError

    def allocate_kv_pool(
        self, num_layers: int, shape: tuple[int, ...], dtype: torch.dtype
    ) -> list[KVCache]:
        raise NotImplementedError

    def profile_kv_blocks(
        self,
        model: torch.nn.Module,
        kv_shape_tail: tuple[int, ...],
        kv_dtype: torch.dtype,
        num_layers: int,
        vocab: int,
    ) -> int | None:
        """The pool's blocks where the backend sizes it itself (a GPU: what is left of
        --gpu-memory-utilization); None: the memory budget of --kv-cache-memory-gb."""
        return None

    def start(self, model: torch.nn.Module, kv_caches: list[KVCache], vocab: int) -> None:
        """Once the pool exists: warm-up, graph capture."""

    # ---- a step ---------------------------------------------------------------
    def prepare(self, seqs: StepInputs) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
        raise NotImplementedError

    def before_forward(self, meta: AttentionMetadata) -> None:
        """Per-step state of the weights (the CPU's StepRows)."""

    def execute(
        self,
        model: torch.nn.Module,
        kv_caches: list[KVCache],
        seqs: StepInputs,
        argmax_vocab: int | None = None,
    ) -> torch.Tensor:
        """One forward; float32 logits [sampling seqs, vocab], or with `argmax_vocab` int64
        tokens where the model's head takes the argmax itself (CausalLM.greedy_tokens)."""
        input_ids, positions, meta = self.prepare(seqs)
        self.before_forward(meta)
        hidden = model(input_ids, positions, kv_caches, meta)[meta.logits_indices]
        if argmax_vocab is not None:
            tokens = model.greedy_tokens(hidden, argmax_vocab)  # type: ignore[operator]
            if tokens is not None:
                return tokens
        return model.compute_logits(hidden).float()  # type: ignore[operator]

    def resolve_prev(self, ids: torch.Tensor, prev: list[int]) -> None:
        """Overlapped scheduling: ids[i] = the in-flight step's token of its row prev[i]
        where prev[i] >= 0 (the first len(prev) ids), read on the device (staging.py)."""
        n = len(prev)
        if n == 0 or max(prev) < 0:
            return
        col = to_device(torch.tensor(prev, dtype=torch.long), ids.device)
        ids[:n].copy_(take_placeholders(ids[:n], col, self.prev_tokens))
