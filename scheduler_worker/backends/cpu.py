"""The CPU backend: the C++ kernels chosen per ISA at run time (scheduler_worker/kernels),
the one-call decode step (models/decode_plan.py), the KV cache in float16 under a float32
model, and decode-only steps built from buffers kept between steps (DecodeInputs).

A step's flat token dimension, and the metadata attention.py reads:

    [ decode tokens (1 per sequence) | prefill chunk of seq a | prefill chunk of seq b | ... ]
"""

from __future__ import annotations

from typing import Protocol

import torch

from common.config import ConfigError
from scheduler_worker import kernels
from scheduler_worker.attention import (
    PAGED_PREFILL_MAX_CONTEXT,
    AttentionMetadata,
    PrefillSlice,
    choose_decode_kernel,
)
from scheduler_worker.backends.base import (
    Backend,
    DecodeRows,
    KVCache,
    SeqInput,
    StepInputs,
    step_order,
)
from scheduler_worker.backends.cpu_kv_pool import allocate_kv_pool
from scheduler_worker.backends.device import TORCH_DTYPES
from scheduler_worker.backends.ops import CpuKernelOps


class StepRows(Protocol):
    """The quantized linears' per-step state (quant/linear.py's StepRows): which leading
    rows of a step the integer kernels take, set from the step's decode rows."""

    def set_step(self, num_decode: int) -> None: ...


def width_bucket(n: int) -> int:
    """Block-table width of a decode step: the next power of two."""
    return 1 << max(0, n - 1).bit_length()


class DecodeInputs:
    """The inputs of decode-only steps, kept between steps: each step writes its rows into
    these buffers (through numpy views, no tensor allocated) and the model gets views of
    them. They grow when a step needs more rows or a wider block table, which happens a
    few times per process. With `bucket_width` (the paged decode kernel, which reads only
    each row's context) the block table's width is rounded up to a power of two, so the
    buffers' views take a few shapes."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self.rows = self.width = 0
        self._grow(8, 8)

    def _grow(self, rows: int, width: int) -> None:
        self.rows, self.width = max(rows, self.rows), max(width, self.width)
        r, w = self.rows, self.width
        self.ids, self.pos, self.slots, self.ctx = (
            torch.zeros(r, dtype=torch.long) for _ in "ipsc"
        )
        self.tables = torch.zeros(r, w, dtype=torch.long)
        self.rows_index = torch.arange(r, dtype=torch.long)
        self.np = [t.numpy() for t in (self.ids, self.pos, self.slots, self.ctx, self.tables)]

    def fill(self, rows: DecodeRows, bucket_width: bool) -> int:
        """Write the decode rows; returns the block-table width used."""
        n, bs = len(rows), self.block_size
        w = int(rows.position_array().max()) // bs + 1
        w = width_bucket(w) if bucket_width else w
        if n > self.rows or w > self.width:
            self._grow(max(n, 2 * self.rows) if n > self.rows else 0, width_bucket(w))
        ids, pos, slots, ctx, tables = self.np
        # past a row's blocks: the tables' pad, a block of the pool no kernel reads
        p, tables[:n, :w], slots[:n] = rows.staged(bs, w)
        ids[:n] = rows.token_ids  # a placeholder (-1): resolve_prev
        pos[:n] = p
        ctx[:n] = p + 1
        return w


class CpuBackend(Backend):
    name = "cpu"

    def __init__(
        self,
        dtype: torch.dtype,
        block_size: int,
        kernel_isa: str | None,
        step_rows: StepRows,
    ) -> None:
        super().__init__(torch.device("cpu"), dtype, block_size)
        self.kernel_isa = kernel_isa  # the one path every C++ op takes; None: pure torch
        self.isa_index = 0 if kernel_isa is None else kernels.isa_index(kernel_isa)
        self.decode_kernel = choose_decode_kernel(dtype, paged=kernel_isa is not None)
        if kernel_isa is not None:
            self.ops = CpuKernelOps(self.isa_index, self.decode_kernel == "paged")
        # the paged kernel's rows are computed alone: a verify as decode rows is exact
        self.verify_as_decode_rows = self.decode_kernel == "paged"
        self.step_rows = step_rows  # which rows of a step the integer kernels take
        self.decode_inputs = DecodeInputs(block_size)

    def kv_cache_dtype(self, want: str) -> torch.dtype:
        """The KV cache's element type (--kv-cache-dtype). auto: float16 under a float32
        model whose decode attention is the C++ paged kernel, as llama.cpp keeps its cache:
        at 32 streams that kernel reads every cached K/V row of every layer each step, from
        memory, and half the bytes is most of its time (docs/benchmarks.md); float16's
        11-bit mantissa keeps the scores within ~1e-3. Else the model's dtype. A type other
        than the model's needs the paged kernel (the torch paths read the cache as is)."""
        paged_f32 = self.decode_kernel == "paged" and self.dtype == torch.float32
        if want == "fp8":
            raise ConfigError(
                "--kv-cache-dtype fp8 is the GPU's (sm_89 and later); the CPU's cache is "
                "float16, bfloat16 or float32"
            )
        if want == "auto":
            return torch.float16 if paged_f32 else self.dtype
        dtype = TORCH_DTYPES[want]
        if dtype != self.dtype and not (dtype == torch.float16 and paged_f32):
            raise ConfigError(
                f"--kv-cache-dtype {want} with a {str(self.dtype).removeprefix('torch.')} "
                f"model needs the C++ paged decode kernel and a float32 model (float16 "
                f"cache); this model decodes with '{self.decode_kernel}': use "
                "--kv-cache-dtype auto"
            )
        return dtype

    def allocate_kv_pool(
        self, num_layers: int, shape: tuple[int, ...], dtype: torch.dtype
    ) -> list[KVCache]:
        return allocate_kv_pool(num_layers, shape, dtype)

    def before_forward(self, meta: AttentionMetadata) -> None:
        self.step_rows.set_step(meta.num_decode)

    # ---- step inputs ---------------------------------------------------------------
    def prepare(self, seqs: StepInputs) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
        """Flatten the step's tokens (decodes first) and build the attention metadata.

        Returns (input_ids, positions, metadata); metadata.logits_indices lists the last
        token of each sequence with `sample` set, in the order of `seqs`.
        """
        if isinstance(seqs, DecodeRows):
            return self._prepare_decode(self.decode_inputs, seqs)
        if all(len(s.token_ids) == 1 and s.sample for s in seqs):
            return self._prepare_decode(self.decode_inputs, DecodeRows.of(seqs, pad=0))
        bs = self.block_size
        order = step_order(seqs)
        num_decode = sum(1 for s in seqs if len(s.token_ids) == 1)
        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        last_index = [0] * len(seqs)
        prefills: list[PrefillSlice] = []
        for i in order:
            s = seqs[i]
            start, n = s.num_computed, len(s.token_ids)
            slots.extend(s.slots(bs))
            offset = len(input_ids)
            input_ids.extend(s.token_ids)
            positions.extend(range(start, start + n))
            last_index[i] = offset + n - 1 if s.sample else -1
            if n != 1:
                prefills.append(self._prefill_slice(offset, n, start, s.block_table))
        meta = AttentionMetadata(
            slot_mapping=torch.tensor(slots, dtype=torch.long),
            num_decode=num_decode,
            prefills=prefills,
            logits_indices=torch.tensor([i for i in last_index if i >= 0], dtype=torch.long),
            decode_kernel=self.decode_kernel,
            kernel_isa=self.isa_index,
        )
        if num_decode:
            dec = [seqs[i] for i in order[:num_decode]]
            ctx = [s.num_computed + 1 for s in dec]
            max_blocks = (max(ctx) + bs - 1) // bs
            tables = [
                s.block_table[:max_blocks] + [0] * (max_blocks - len(s.block_table[:max_blocks]))
                for s in dec
            ]
            meta.decode_block_tables = torch.tensor(tables, dtype=torch.long)
            ctx_t = torch.tensor(ctx, dtype=torch.long)
            meta.decode_context_lens = ctx_t
            meta.decode_max_context = max(ctx)
            if self.decode_kernel != "paged":
                meta.decode_mask = (torch.arange(max_blocks * bs)[None, :] < ctx_t[:, None]).view(
                    num_decode, 1, 1, -1
                )
        ids = torch.tensor(input_ids, dtype=torch.long)
        pos = torch.tensor(positions, dtype=torch.long)
        self.resolve_prev(ids, [seqs[i].prev_row for i in order[:num_decode]])  # decodes lead
        if self.decode_kernel == "paged":
            _paged_rows(meta, [seqs[i] for i in order], bs, pos)
        return ids, pos, meta

    def _prepare_decode(
        self, buf: DecodeInputs, rows: DecodeRows
    ) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
        """prepare() for a decode-only step (every row sampled), from the kept buffers."""
        w = buf.fill(rows, self.decode_kernel == "paged")
        m = len(rows)
        logits_indices = buf.rows_index[:m]
        ctx_t = buf.ctx[:m]
        meta = AttentionMetadata(
            slot_mapping=buf.slots[:m],
            num_decode=m,
            logits_indices=logits_indices,
            decode_kernel=self.decode_kernel,
            kernel_isa=self.isa_index,
            decode_block_tables=buf.tables[:m, :w],
            decode_context_lens=ctx_t,
            decode_max_context=int(rows.position_array().max()) + 1,
        )
        if self.decode_kernel != "paged":
            cols = w * self.block_size
            meta.decode_mask = (torch.arange(cols)[None, :] < ctx_t[:, None]).view(m, 1, 1, -1)
        self.resolve_prev(buf.ids, rows.prev_rows)
        return buf.ids[:m], buf.pos[:m], meta

    def _prefill_slice(self, offset: int, n: int, start: int, table: list[int]) -> PrefillSlice:
        p = PrefillSlice(start=offset, end=offset + n, num_context=start + n)
        if start == 0:
            return p  # whole context is this chunk: causal attention on the fresh K/V
        if self.decode_kernel == "paged" and _paged_prefill(start + n):
            return p  # the kernel reads the blocks in place (_paged_rows): no gather, no mask
        nblocks = (start + n + self.block_size - 1) // self.block_size
        p.block_ids = torch.tensor(table[:nblocks], dtype=torch.long)
        q_pos = torch.arange(start, start + n)
        p.mask = torch.arange(start + n)[None, :] <= q_pos[:, None]
        return p


def _paged_prefill(num_context: int) -> bool:
    """Whether a prefill chunk of this context is attended by the paged kernel, where it
    serves the decodes (attention.PAGED_PREFILL_MAX_CONTEXT; None: every chunk)."""
    limit = PAGED_PREFILL_MAX_CONTEXT
    return limit is None or num_context <= limit


def _paged_rows(meta: AttentionMetadata, seqs: list[SeqInput], bs: int, pos: torch.Tensor) -> None:
    """Marks the step's short prefills (_paged_prefill) `paged` and sets the kernel's rows
    (`AttentionMetadata.row_*`): theirs and the decodes'. `seqs` in the step's token
    order, `pos` the tokens' positions."""
    short = [p for p in meta.prefills if _paged_prefill(p.num_context)]
    if not short:
        return
    for p in short:
        p.paged = True
    tables: list[torch.Tensor] = []
    index: list[torch.Tensor] = []
    offset = 0
    width = max((s.num_computed + len(s.token_ids) + bs - 1) // bs for s in seqs)
    for s in seqs:
        n = len(s.token_ids)
        if n == 1 or _paged_prefill(s.num_computed + n):
            table = s.block_table[:width]
            row = torch.tensor(table + [0] * (width - len(table)), dtype=torch.long)
            tables.append(row.expand(n, width))
            index.append(torch.arange(offset, offset + n))
        offset += n
    rows = torch.cat(index)
    meta.row_block_tables = torch.cat(tables)
    if rows.numel() == pos.numel():
        meta.row_context_lens = pos + 1
    else:
        meta.row_index = rows
        meta.row_context_lens = pos.index_select(0, meta.row_index) + 1
