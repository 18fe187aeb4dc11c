"""Decode steps replayed from captured graphs, one per batch-size bucket (steps with
prompt tokens: mixed_graphs.py).

    sizes:   1, 2, 4, 8, 16, 24, ... up to max_num_seqs (rounded up to 8), as vLLM
    a step of n decodes ──▶ bucket b = the smallest size >= n
         host: ids, positions, slots, context lens, block tables of the n rows
               ──▶ a pinned staging buffer (one of two, in turn: staging.py) ──one copy──▶
               the device
         device: staged rows ──▶ the graph's static inputs [:b]; rows n..b-1 are padding:
               token 0 at position 0, its K/V written to the scratch slot (a block the
               block manager never hands out), context length 1 (attends that slot)
         replay graph b ──▶ logits [b, vocab] (static output) ──▶ rows [:n]

Everything the captured kernels read lives at a fixed address (StaticDecodeInputs), so a
replay is one launch for the whole model.

The graph type is injected: CUDA graphs on a GPU, and in tests a stand-in that records
the captured callable and calls it again on replay (CPU), so that bucketing, padding and
the static buffers are tested without a GPU.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from typing import NamedTuple, Protocol

import numpy as np
import torch

from scheduler_worker.attention import AttentionMetadata
from scheduler_worker.backends.base import DecodeRows, KVCache, StepInputs
from scheduler_worker.backends.block_tables import BlockTables
from scheduler_worker.backends.int_columns import int64_array
from scheduler_worker.backends.staging import StaticTokens

# staged per row before its block table: token, position, slot, context length, and the
# row of the step in flight whose sampled token is this row's (-1: the token is known)
COLS = 5


def capture_sizes(max_num_seqs: int) -> list[int]:
    """1, 2, 4, 8, then every 8, up to max_num_seqs rounded up to a multiple of 8."""
    top = max(1, max_num_seqs)
    top8 = -(-top // 8) * 8 if top > 8 else top
    small = [s for s in (1, 2, 4, 8) if s < top8]
    return small + list(range(16, top8 + 1, 8)) + ([top8] if top8 <= 8 else [])


def bucket_for(n: int, sizes: list[int]) -> int | None:
    """The smallest captured size holding n rows; None past the largest."""
    i = bisect.bisect_left(sizes, n)
    return sizes[i] if i < len(sizes) else None


class Graph(Protocol):
    def replay(self) -> None: ...


# captures a step (a callable returning its logits): the graph and its static output
MakeGraph = Callable[[Callable[[], torch.Tensor]], tuple[Graph, torch.Tensor]]


class StandInGraph:
    """A graph for tests on a CPU: "capture" runs the step once and keeps its output
    tensor; replay runs it again into that same tensor, as a CUDA graph's static output."""

    def __init__(self, fn: Callable[[], torch.Tensor]) -> None:
        self.fn = fn
        self.output = fn()

    def replay(self) -> None:
        self.output.copy_(self.fn())


class SharedLogits:
    """One logits buffer for all the graphs of a kind: they replay one at a time, on one
    stream, and a step's logits are read (sampled, copied) before the next replay, so each
    graph writes the first rows of the same buffer. Graph memory is then one buffer of the
    largest size, not one per size (1,140 MiB for the 1B model's 39 graphs with an output
    each; several GB at Gemma 3's 262k-token vocabulary). Allocated by the first call, the
    warm-up of the largest graph (captured first), outside any graph's pool."""

    def __init__(self) -> None:
        self.buf: torch.Tensor | None = None

    def put(self, logits: torch.Tensor) -> torch.Tensor:
        n = logits.shape[0]
        if self.buf is None:
            self.buf = torch.empty_like(logits)
        elif n > self.buf.shape[0] or logits.shape[1:] != self.buf.shape[1:]:
            # a graph captured earlier writes this buffer: it is never reallocated
            raise RuntimeError(
                f"logits of {tuple(logits.shape)} past the shared {tuple(self.buf.shape)}"
            )
        out = self.buf[:n]
        out.copy_(logits)
        return out


class HeldTables(NamedTuple):
    """What the static tables hold since the fill that last wrote them: rows `slots` of
    `source` at `version`, `rows` rows (padding past the slots'), `width` blocks wide."""

    source: BlockTables
    version: int
    slots: list[int]
    rows: int
    width: int


class StaticDecodeInputs(StaticTokens):
    """The graphs' inputs at fixed addresses, sized for the largest bucket: the token
    columns (staging.py) and each row's context length and block table."""

    def __init__(
        self,
        max_rows: int,
        max_blocks: int,
        device: torch.device,
        scratch_block: int,
        block_size: int,
    ) -> None:
        super().__init__(
            max_rows, max_rows * (COLS + max_blocks), device, scratch_block, block_size
        )
        self.max_rows, self.max_blocks = max_rows, max_blocks
        # every row a padding row until filled (the capture's warm-up runs on these)
        self.ctx = torch.ones(max_rows, dtype=torch.long, device=device)
        self.tables = torch.full(
            (max_rows, max_blocks), scratch_block, dtype=torch.long, device=device
        )
        self.held: HeldTables | None = None

    def _holds(self, rows: DecodeRows, b: int, w: int) -> bool:
        """The static tables already hold these rows' tables: the same rows of the same
        BlockTables in the same order, none written since, as wide (most overlapped steps:
        a row starts a block one step in block_size)."""
        h = self.held
        return (
            h is not None
            and h.source is rows.tables
            and h.version == rows.tables.version
            and h.rows == b
            and w <= h.width
            and h.slots == rows.slots
        )

    def fill(
        self,
        rows: StepInputs,
        b: int,
        prev_tokens: torch.Tensor | None = None,
    ) -> int:
        """Stage the n decode rows and the padding up to b, copy them to the static
        inputs, a placeholder token read from `prev_tokens` (the step in flight's sampled
        tokens, on the device); returns the number of such rows."""
        if not isinstance(rows, DecodeRows):
            rows = DecodeRows.of(rows, self.scratch_block)
        n, bs = len(rows), self.block_size
        w = int(rows.position_array().max()) // bs + 1  # numpy's max: the list's ran ~6x
        if w > self.max_blocks:
            raise ValueError(f"a decode of {w} blocks, past the graphs' {self.max_blocks}")
        held = self._holds(rows, b, w)  # then only the token columns are staged and sent
        width = COLS if held else COLS + w
        staged_rows = self.staging.next_host()[: b * width].view(b, width)
        a = staged_rows.numpy()
        if held:
            pos, slots = rows.staged_slots(bs)
        else:  # past a row's blocks: read by none
            pos, _, slots = rows.staged(bs, w, a[:n, COLS:])
        if b > n:
            a[n:, 0:2] = 0
            a[n:, 2] = self.scratch_block * bs  # padding: K/V into the scratch slot, and
            a[n:, 3] = 1  # attends it alone
            a[n:, 4] = -1
            a[n:, COLS:] = self.scratch_block
        num_prev = n - rows.num_known()
        if num_prev == n:  # every token in flight (overlapped, most steps): no list to read
            a[:n, 0] = 0
        else:
            a[:n, 0] = int64_array(rows.token_ids)
            np.maximum(a[:n, 0], 0, out=a[:n, 0])  # a placeholder (-1): read from prev_tokens
        a[:n, 1] = pos
        a[:n, 2] = slots
        a[:n, 3] = pos + 1
        a[:n, 4] = int64_array(rows.prev_rows)  # not the list: numpy's packing a row
        staged = self.staging.send(staged_rows)
        cols = staged[:, :COLS].unbind(1)  # token, position, slot, context, prev: one call
        prev = cols[4] if num_prev else None
        self.put_tokens(cols[0], cols[1], cols[2], prev, prev_tokens, n if num_prev == n else 0)
        self.ctx[:b].copy_(cols[3])
        if not held:
            self.tables[:b, :w].copy_(staged[:, COLS:])
            tables = rows.tables
            self.held = HeldTables(tables, tables.version, list(rows.slots), b, w)
        return num_prev

    def meta(
        self, b: int, decode_kernel: str, kernel_isa: int, num_splits: int
    ) -> AttentionMetadata:
        """The metadata of a b-row decode step, views of the static inputs. Tables span
        every block a context may have: a kernel reads a row's blocks up to its length."""
        return AttentionMetadata(
            slot_mapping=self.slots[:b],
            num_decode=b,
            logits_indices=None,
            decode_kernel=decode_kernel,
            kernel_isa=kernel_isa,
            decode_block_tables=self.tables[:b],
            decode_context_lens=self.ctx[:b],
            num_splits=num_splits,
        )


class GraphSet:
    """The graphs of one kind (decode: here; mixed: mixed_graphs.py), by size, each with
    its static output: the first rows of one SharedLogits buffer."""

    def __init__(self, inputs: StaticTokens, sizes: list[int]) -> None:
        self.inputs, self.sizes = inputs, sizes
        self.graphs: dict[int, Graph] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        self.logits = SharedLogits()

    def step_fn(
        self, model: torch.nn.Module, kv_caches: list[KVCache], size: int
    ) -> Callable[[], torch.Tensor]:
        """What the graph of `size` runs, from the static inputs, into the shared logits."""
        raise NotImplementedError

    def add(self, size: int, graph: Graph, output: torch.Tensor) -> None:
        self.graphs[size] = graph
        self.outputs[size] = output

    def capture(
        self, model: torch.nn.Module, kv_caches: list[KVCache], make_graph: MakeGraph
    ) -> bool:
        """One graph a size, largest first (make_graph: capture a step, return the graph
        and its output). Out of device memory: the sizes captured so far are kept (the
        larger ones) and the rest run eagerly; returns whether every size was captured."""
        try:
            with torch.inference_mode():
                for size in sorted(self.sizes, reverse=True):
                    self.add(size, *make_graph(self.step_fn(model, kv_caches, size)))
        except torch.OutOfMemoryError:
            if self.inputs.device.type == "cuda":
                torch.cuda.synchronize(self.inputs.device)
            return False
        return True

    @property
    def max_size(self) -> int:
        """The largest size captured (rows of a decode graph, tokens of a mixed one)."""
        return max(self.graphs) if self.graphs else 0

    def bucket(self, n: int) -> int | None:
        return bucket_for(n, sorted(self.graphs))

    def put_logits(self, model: torch.nn.Module, hidden: torch.Tensor) -> torch.Tensor:
        """A step's logits written into the shared buffer (called inside the capture)."""
        return self.logits.put(model.compute_logits(hidden).float())  # type: ignore[operator]


class DecodeGraphs(GraphSet):
    """One captured decode step per bucket; replay(seqs) runs a decode-only step."""

    def __init__(
        self,
        inputs: StaticDecodeInputs,
        sizes: list[int],
        make_meta: Callable[[int], AttentionMetadata],
    ) -> None:
        super().__init__(inputs, sizes)
        self.inputs: StaticDecodeInputs = inputs
        self.make_meta = make_meta

    def step_fn(
        self, model: torch.nn.Module, kv_caches: list[KVCache], b: int
    ) -> Callable[[], torch.Tensor]:
        """What a graph of b rows runs: the forward and the logits, from the static inputs,
        into the shared logits buffer."""
        inp, meta = self.inputs, self.make_meta(b)

        def run() -> torch.Tensor:
            hidden = model(inp.ids[:b], inp.pos[:b], kv_caches, meta)
            return self.put_logits(model, hidden)

        return run

    def replay(self, rows: StepInputs, prev_tokens: torch.Tensor | None) -> torch.Tensor:
        """Logits [n, vocab] of a decode-only step of n <= max_size rows (a view of the
        graph's output: valid until the next replay of that graph)."""
        n = len(rows)
        b = self.bucket(n)
        assert b is not None, f"{n} rows past the largest graph ({self.max_size})"
        self.inputs.fill(rows, b, prev_tokens)
        self.graphs[b].replay()
        return self.outputs[b][:n]
