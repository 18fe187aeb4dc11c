"""Steps with prompt tokens replayed from captured graphs, one per token size.

    sizes:   64, 128, 256, 512 tokens (MIXED_SIZES, within --max-num-batched-tokens)
    a step of n tokens over k sequences (a new prompt beside the running decodes, a chunk
    of a long one) ──▶ size t = the smallest >= n, s = min(t, max_num_seqs) sequences
         host: ids, positions, slots, placeholder rows, query starts, context lengths,
               the rows to sample, block tables ──▶ a pinned buffer ──one copy──▶ the device
               (staging.py, as a decode step's)
         padding: tokens n..t-1 write the scratch slot and belong to no sequence;
               sequences k..s-1 have no tokens (their tiles of the kernel return at once)
         replay graph t ──▶ logits of the sampled rows (static output)

Every row, decodes included, goes through the varlen prefill kernel, whose grid needs only
t and s (triton_prefill.py). Eager, such a step launched ~150 kernels from Python, several
decode steps' time for every request that arrived mid-stream (docs/benchmarks.md, "Second
GPU session").
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from common.log import get_logger
from scheduler_worker.attention import AttentionMetadata
from scheduler_worker.backends.base import KVCache, SeqInput
from scheduler_worker.backends.graphs import GraphSet, MakeGraph
from scheduler_worker.backends.staging import StaticTokens
from scheduler_worker.backends.varlen import VarlenColumns, write_varlen

log = get_logger("cuda")

MIXED_SIZES = (64, 128, 256, 512)  # tokens of the mixed-step graphs (within the budget)


def mixed_sizes(max_num_batched_tokens: int) -> list[int]:
    """The mixed-step sizes a token budget can fill: MIXED_SIZES up to the budget, and the
    budget itself where it falls between two."""
    sizes = [t for t in MIXED_SIZES if t <= max_num_batched_tokens]
    if max_num_batched_tokens < MIXED_SIZES[-1] and max_num_batched_tokens not in sizes:
        sizes.append(max_num_batched_tokens)
    return sizes


class StaticMixedInputs(StaticTokens):
    """A mixed step's inputs at fixed addresses, for up to `max_tokens` tokens of up to
    `max_seqs` sequences: the token columns (staging.py) and, per sequence, its query
    start, context length, sampled row and block table."""

    def __init__(
        self,
        max_tokens: int,
        max_seqs: int,
        max_blocks: int,
        device: torch.device,
        scratch_block: int,
        block_size: int,
    ) -> None:
        size = 4 * max_tokens + 3 * max_seqs + 1 + max_seqs * max_blocks
        super().__init__(max_tokens, size, device, scratch_block, block_size)
        self.max_tokens, self.max_seqs, self.max_blocks = max_tokens, max_seqs, max_blocks
        s = max_seqs
        self.query_start = torch.zeros(s + 1, dtype=torch.int32, device=device)
        self.seq_lens = torch.ones(s, dtype=torch.int32, device=device)
        self.logits_rows = torch.zeros(s, dtype=torch.long, device=device)
        self.tables = torch.full((s, max_blocks), scratch_block, dtype=torch.int32, device=device)

    def fill(
        self, seqs: list[SeqInput], t: int, s: int, prev_tokens: torch.Tensor | None = None
    ) -> int:
        """Stage `seqs` (in the step's order: decodes first) padded to t tokens and s
        sequences; returns the number of sampled rows (the first rows of the output, in
        the order of `seqs`)."""
        bs, scratch = self.block_size, self.scratch_block
        w = max(-(-(q.num_computed + len(q.token_ids)) // bs) for q in seqs)
        if w > self.max_blocks:
            raise ValueError(f"a step of {w} blocks, past the graphs' {self.max_blocks}")
        o = 4 * t
        host = self.staging.next_host()[: o + 3 * s + 1 + s * w]
        a = host.numpy()
        ids, pos, slots, prev = (a[k * t : (k + 1) * t] for k in range(4))
        qs, lens, rows = (
            a[o : o + s + 1],
            a[o + s + 1 : o + 2 * s + 1],
            a[o + 2 * s + 1 : o + 3 * s + 1],
        )
        tables = a[o + 3 * s + 1 :].reshape(s, w)
        ids[:], pos[:], slots[:], prev[:] = 0, 0, scratch * bs, -1  # the padding
        lens[:], rows[:], tables[:] = 1, 0, scratch
        cols = VarlenColumns(ids, pos, slots, prev, qs, lens, rows, tables)
        n, sampled = write_varlen(seqs, bs, cols)
        qs[len(seqs) :] = n  # padding sequences: no tokens
        staged = self.staging.send(host)
        v = [staged[k * t : (k + 1) * t] for k in range(4)]
        self.put_tokens(v[0], v[1], v[2], v[3] if bool((prev >= 0).any()) else None, prev_tokens)
        self.query_start[: s + 1].copy_(staged[o : o + s + 1])
        self.seq_lens[:s].copy_(staged[o + s + 1 : o + 2 * s + 1])
        self.logits_rows[:s].copy_(staged[o + 2 * s + 1 : o + 3 * s + 1])
        self.tables[:s, :w].copy_(staged[o + 3 * s + 1 :].view(s, w))
        return sampled

    def meta(self, t: int, s: int) -> AttentionMetadata:
        """The metadata of a mixed step of t tokens and s sequences: views of the static
        inputs, every row through the varlen (prefill) kernel."""
        return AttentionMetadata(
            slot_mapping=self.slots[:t],
            num_decode=0,
            logits_indices=self.logits_rows[:s],
            decode_kernel="triton",
            query_start_loc=self.query_start[: s + 1],
            seq_lens=self.seq_lens[:s],
            block_tables=self.tables[:s],
            max_query_len=t,
        )


class MixedGraphs(GraphSet):
    """One captured mixed step per token size t (with s = min(t, max_num_seqs) sequences);
    replay(seqs) runs a step of at most max_size tokens."""

    def __init__(self, inputs: StaticMixedInputs, sizes: list[int], max_num_seqs: int) -> None:
        super().__init__(inputs, sizes)
        self.inputs: StaticMixedInputs = inputs
        self.max_num_seqs = max_num_seqs

    def seqs_for(self, t: int) -> int:
        return min(t, self.max_num_seqs)

    def step_fn(
        self, model: torch.nn.Module, kv_caches: list[KVCache], size: int
    ) -> Callable[[], torch.Tensor]:
        t = size
        inp, s = self.inputs, self.seqs_for(t)
        meta = inp.meta(t, s)

        def run() -> torch.Tensor:
            hidden = model(inp.ids[:t], inp.pos[:t], kv_caches, meta)[inp.logits_rows[:s]]
            return self.put_logits(model, hidden)

        return run

    def fits(self, seqs: list[SeqInput]) -> bool:
        return bool(self.graphs) and sum(len(q.token_ids) for q in seqs) <= self.max_size

    def replay(self, seqs: list[SeqInput], prev_tokens: torch.Tensor | None) -> torch.Tensor:
        """Logits [sampled rows, vocab], in the order of `seqs` (a view of the graph's
        output: valid until the next replay of that graph)."""
        t = self.bucket(sum(len(q.token_ids) for q in seqs))
        assert t is not None, "a step past the largest mixed graph"
        n = self.inputs.fill(seqs, t, self.seqs_for(t), prev_tokens)
        self.graphs[t].replay()
        return self.outputs[t][:n]


def capture_mixed_graphs(
    model: torch.nn.Module,
    kv_caches: list[KVCache],
    make_graph: MakeGraph,
    inputs_args: dict,
    max_num_seqs: int,
    max_num_batched_tokens: int,
) -> MixedGraphs | None:
    """One graph per mixed-step size, largest first (GraphSet.capture); out of memory keeps
    those captured so far and says so. `inputs_args`: StaticMixedInputs' max_blocks,
    device, scratch_block and block_size."""
    sizes = mixed_sizes(max_num_batched_tokens)
    if not sizes:
        return None
    top = max(sizes)
    inputs = StaticMixedInputs(top, min(top, max_num_seqs), **inputs_args)
    mixed = MixedGraphs(inputs, sizes, max_num_seqs)
    if not mixed.capture(model, kv_caches, make_graph):
        log.warning(
            "out of GPU memory capturing mixed-step graphs: kept %s; larger steps with "
            "prompt tokens run eagerly",
            ",".join(str(t) for t in sorted(mixed.graphs)) or "none",
        )
    return mixed if mixed.graphs else None
