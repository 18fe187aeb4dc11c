"""The device backend's interface: what differs between a CPU and a GPU.

    ModelRunner ── owns ──▶ Backend
                             ├─ ops            the layers' op set (backends/ops.py)
                             ├─ kv_cache_dtype / allocate_kv_pool / kv_pool_blocks
                             ├─ prepare(seqs)  step inputs + AttentionMetadata, in its buffers
                             ├─ start(...)     after the KV pool: CUDA graph capture
                             └─ execute(...)   one forward: eager, or a captured graph replayed

The engine loop, the scheduler and the models are written once; a backend is chosen by the
device (backends/select.py). `execute` never waits for the device: it returns the step's
logits (or greedy tokens) as device tensors, so that the engine can prepare the next step
while this one runs (engine.py, overlapped scheduling).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from scheduler_worker.attention import AttentionMetadata
from scheduler_worker.backends.block_tables import BlockTables
from scheduler_worker.backends.ops import TORCH_OPS, TorchOps

KVCache = tuple[torch.Tensor, torch.Tensor]


@dataclass
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
    # its row of the scheduler's BlockTables (Backend.block_tables), which hold block_table
    # as well; -1: none (a step built by hand), block_table is read
    slot: int = -1

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


def step_order(seqs: list[SeqInput]) -> list[int]:
    """The order of the sequences' tokens in a step: decodes (one token) first."""
    return sorted(range(len(seqs)), key=lambda i: len(seqs[i].token_ids) != 1)


class Backend:
    """The generic part: eager execution of whatever `prepare` builds."""

    name = "base"
    ops: TorchOps = TORCH_OPS
    overlap = False  # execute() returns before the device is done (a GPU)

    def __init__(self, device: torch.device, dtype: torch.dtype, block_size: int) -> None:
        self.device, self.dtype, self.block_size = device, dtype, block_size
        self.prev_tokens: torch.Tensor | None = None  # the step in flight's sampled tokens
        self.chained = False  # this step launches while the one before it is in flight
        # the scheduler's tables (SeqInput.slot), set by the engine: a step's rows gathered
        self.block_tables: BlockTables | None = None

    # ---- the KV pool ----------------------------------------------------------
    def kv_cache_dtype(self, want: str) -> torch.dtype:
        raise NotImplementedError

    def allocate_kv_pool(
        self, num_layers: int, shape: tuple[int, ...], dtype: torch.dtype
    ) -> list[KVCache]:
        raise NotImplementedError

    def kv_pool_blocks(self, bytes_per_block: int) -> int | None:
        """The pool's blocks where the backend sizes it itself (a GPU: what is left of
        --gpu-memory-utilization); None: the memory budget of --kv-cache-memory-gb."""
        return None

    def start(self, model: torch.nn.Module, kv_caches: list[KVCache], vocab: int) -> None:
        """Once the pool exists: warm-up, graph capture."""

    # ---- a step ---------------------------------------------------------------
    def prepare(self, seqs: list[SeqInput]) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
        raise NotImplementedError

    def before_forward(self, meta: AttentionMetadata) -> None:
        """Per-step state of the weights (the CPU's StepRows)."""

    def execute(
        self,
        model: torch.nn.Module,
        kv_caches: list[KVCache],
        seqs: list[SeqInput],
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

    def resolve_prev(self, ids: torch.Tensor, prev_rows: list[int], rows: list[int]) -> None:
        """Overlapped scheduling: ids[rows[i]] = the in-flight step's token of row
        prev_rows[i], read on the device (no host round trip)."""
        if not rows:
            return
        assert self.prev_tokens is not None, "a placeholder token with no step in flight"
        dev, pin = ids.device, ids.device.type == "cuda"
        src, dst = (torch.tensor(v, dtype=torch.long) for v in (prev_rows, rows))
        if pin:  # a pageable copy may wait for the step in flight
            src, dst = src.pin_memory(), dst.pin_memory()
        src, dst = src.to(dev, non_blocking=True), dst.to(dev, non_blocking=True)
        ids.index_copy_(0, dst, self.prev_tokens.index_select(0, src).to(ids.dtype))
