"""The CUDA backend: Triton kernels for the layer ops and paged attention, decode steps
replayed from CUDA graphs, the KV pool sized from --gpu-memory-utilization.

    start:  profile a largest step (max_num_batched_tokens prompt tokens, and the logits of
            max_num_seqs rows) ──▶ KV blocks = total * utilization - weights - that peak
            - a graph reserve ──▶ capture decode graphs (graphs.py) and mixed-step ones
            (mixed_graphs.py), largest first, into one pool; time and memory logged
    a step: decode-only, n <= the largest bucket  ──▶ stage inputs, replay, logits [:n]
            prompt tokens, <= the largest mixed size ──▶ stage, replay the mixed graph
            a larger one (a prompt wave): eager, the Triton prefill kernel over the cache

Nothing here waits for the device: the engine reads a step's tokens while the next runs.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import torch

from common.config import ConfigError
from common.gpus import own_gpus
from common.log import get_logger
from scheduler_worker.attention import AttentionMetadata
from scheduler_worker.backends import triton_decode, triton_masks, triton_penalties, triton_sample
from scheduler_worker.backends.base import (
    Backend,
    DecodeRows,
    DrawRows,
    KVCache,
    MaskRows,
    PenalizeRows,
    SeqInput,
    StepInputs,
    decode_only,
)
from scheduler_worker.backends.device import TORCH_DTYPES, fp8_problem, to_device
from scheduler_worker.backends.device_clock import DeviceClock
from scheduler_worker.backends.gemv_choice import choose_at_start
from scheduler_worker.backends.graphs import (
    DecodeGraphs,
    Graph,
    MakeGraph,
    StaticDecodeInputs,
    capture_sizes,
)
from scheduler_worker.backends.mixed_graphs import MixedGraphs, capture_mixed_graphs
from scheduler_worker.backends.triton_attention import table_width
from scheduler_worker.backends.triton_ops import TritonOps
from scheduler_worker.backends.varlen import VarlenColumns, write_varlen
from scheduler_worker.backends.warm_up import warm_up

log = get_logger("cuda")

SPLIT_CHOICES = (1, 2, 4, 16)  # decode attention's context splits (see splits())
GRAPH_RESERVE = 256 << 20  # kept back from the KV pool for the graphs' own memory


class CudaBackend(Backend):
    name = "cuda"
    overlap = True
    # a drafted row's 1 + k tokens as decode rows replay the decode graph of the step's
    # row count: k changes the bucket, never falls back to eager. Each row's K/V is
    # written before any row attends, as on the CPU; but a GEMM may round a row by the
    # step's row count (cuBLAS picks its kernel by M), so greedy equality with plain
    # decoding holds as measured, not by construction
    verify_as_decode_rows = True

    def __init__(
        self,
        dtype: torch.dtype,
        block_size: int,
        *,
        num_kv_heads: int,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        max_model_len: int,
        gpu_memory_utilization: float,
        enforce_eager: bool,
        head_dim: int = 64,
        device: torch.device | None = None,
        gemv: str = "auto",
    ) -> None:
        """`device`: a GPU; tests run the same code on the CPU under the Triton
        interpreter (TRITON_INTERPRET=1), with stand-in graphs (capture()). `gemv`: the
        few-row GEMV's route, "auto" (measured at start) or "off" (gemv_choice.py)."""
        device = device or torch.device("cuda")
        super().__init__(device, dtype, block_size)
        self.ops = ops = TritonOps(gemv)
        # the sampler's draw: one launch, the uniforms made in it from each row's key
        self.draw_rows = DrawRows(triton_sample.sample_rows_keyed, keyed=True, device="cuda")
        self.penalize_rows = PenalizeRows(triton_penalties.penalize_rows, device="cuda")
        self.mask_rows = MaskRows(triton_masks.mask_rows, device="cuda")
        self.gemv = ops.gemv  # which few-row linears take the GEMV, chosen at start()
        self.num_kv_heads, self.head_dim = num_kv_heads, head_dim
        self.max_num_seqs, self.max_num_batched_tokens = max_num_seqs, max_num_batched_tokens
        self.max_model_len = max_model_len
        self.utilization, self.enforce_eager = gpu_memory_utilization, enforce_eager
        on_gpu = device.type == "cuda"
        self.num_sms = (
            torch.cuda.get_device_properties(device).multi_processor_count if on_gpu else 8
        )
        self.graphs: DecodeGraphs | None = None
        self.mixed: MixedGraphs | None = None  # steps with prompt tokens
        self.scratch_block = 0  # set with the pool: the block past the manager's
        self.facts: dict[str, float] = {}  # logged and exported: memory, capture
        # the forwards' time on the device, and its waits between them (device_clock.py)
        self.clock = DeviceClock(lambda: torch.cuda.Event(enable_timing=True)) if on_gpu else None

    def placement(self, ranks: int = 1) -> tuple[str, list[str]]:
        """The GPU's name and its ranks' GPU ids (tensor parallelism: rank r on the r-th),
        as the launcher named them (common/gpus.py: CUDA_VISIBLE_DEVICES)."""
        dev = self.device
        if dev.type != "cuda":  # the tests' stand-in device
            return super().placement(ranks)
        index = dev.index if dev.index is not None else torch.cuda.current_device()
        return torch.cuda.get_device_name(index), [
            g for i in range(ranks) for g in own_gpus(index + i)
        ]

    def release_cached_memory(self) -> None:
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    # ---- the KV pool ----------------------------------------------------------
    def kv_cache_dtype(self, want: str) -> torch.dtype:
        """auto: the model's dtype. The kernels read float32 / bfloat16 / float16, and fp8:
        E4M3 at scale 1, half bf16's bytes, twice the tokens (docs/fp8.md), sm_89 on."""
        if want != "fp8":
            return self.dtype if want == "auto" else TORCH_DTYPES[want]
        if why := fp8_problem(self.device):
            raise ConfigError(f"--kv-cache-dtype fp8: {why}")
        return torch.float8_e4m3fn

    def allocate_kv_pool(
        self, num_layers: int, shape: tuple[int, ...], dtype: torch.dtype
    ) -> list[KVCache]:
        self.scratch_block = shape[0] - 1
        return [
            (
                torch.zeros(shape, dtype=dtype, device=self.device),
                torch.zeros(shape, dtype=dtype, device=self.device),
            )
            for _ in range(num_layers)
        ]

    def profile_kv_blocks(
        self, model: torch.nn.Module, kv_shape_tail: tuple[int, ...], kv_dtype: torch.dtype,
        num_layers: int, vocab: int,
    ) -> int:  # fmt: skip
        """vLLM's --gpu-memory-utilization: run a largest step (a prompt of
        max_num_batched_tokens tokens, then the logits of max_num_seqs rows) on a pool of
        just its blocks, measure the peak, and give the rest of total * utilization to KV
        blocks (less GRAPH_RESERVE for the graphs when they are captured)."""
        dev = self.device
        torch.cuda.synchronize(dev)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(dev)
        free0, total = torch.cuda.mem_get_info(dev)
        held0 = torch.cuda.memory_allocated(dev)
        bs, tokens = self.block_size, self.max_num_batched_tokens
        nblocks = -(-tokens // bs) + 1
        pool = self.allocate_kv_pool(num_layers, (nblocks, bs, *kv_shape_tail), kv_dtype)
        pool_bytes = torch.cuda.memory_allocated(dev) - held0
        seq = SeqInput([1] * tokens, 0, list(range(nblocks - 1)))
        with torch.inference_mode():
            ids, pos, meta = self.prepare([seq])
            hidden = model(ids, pos, pool, meta)
            rows = hidden[-1:].expand(self.max_num_seqs, -1).contiguous()
            logits = model.compute_logits(rows).float()  # type: ignore[operator]
            # the sampler's float32 temporaries on those logits: a sort, a softmax, masks
            work = [logits.softmax(-1), logits.sort(dim=-1).values]
            del work, logits, rows, hidden
        torch.cuda.synchronize(dev)
        peak = torch.cuda.max_memory_allocated(dev) - held0 - pool_bytes
        del pool
        torch.cuda.empty_cache()
        per_block = (
            2
            * num_layers
            * bs
            * int(torch.tensor(kv_shape_tail).prod())
            * (torch.empty((), dtype=kv_dtype).element_size())
        )
        # what the process holds besides torch's allocator (CUDA context, cuBLAS) counts too
        used_by_others = total - free0 - held0
        budget = total * self.utilization - held0 - peak - used_by_others
        if not self.enforce_eager:
            budget -= GRAPH_RESERVE
        blocks = int(budget // per_block)
        gib = 1 << 30
        self.facts.update(
            gpu_total_bytes=total, weights_bytes=held0, activation_peak_bytes=peak,
            kv_pool_bytes=max(0, blocks) * per_block, utilization=self.utilization,
        )  # fmt: skip
        log.info(
            "GPU memory: %.1f GiB total x %.2f utilization: weights %.2f GiB, largest step "
            "%.2f GiB (%d prompt tokens, logits of %d rows), others %.2f GiB -> KV pool "
            "%.2f GiB, %d blocks of %d tokens (%d tokens)",
            total / gib, self.utilization, held0 / gib, peak / gib, tokens, self.max_num_seqs,
            used_by_others / gib, max(0, blocks) * per_block / gib, blocks, bs, blocks * bs,
        )  # fmt: skip
        return blocks

    # ---- graphs ---------------------------------------------------------------
    def splits(self, rows: int) -> int:
        """Decode attention's cap of context splits for a step of `rows` rows (a graph's
        for its bucket), as if every context were max_model_len long; each row then takes
        no more splits than its own context has key tiles, on the device, so a graph's
        replay follows the step's contexts (triton_decode.py, _row_splits)."""
        want = triton_decode.num_decode_splits(
            rows, self.num_kv_heads, self.max_model_len, self.num_sms, self.head_dim
        )
        # a few values only: each is a kernel of its own to compile (NUM_SPLITS constexpr)
        return max(s for s in SPLIT_CHOICES if s <= want)

    def start(self, model: torch.nn.Module, kv_caches: list[KVCache], vocab: int) -> None:
        """Choose the few-row GEMV's shapes (gemv_choice.py), then capture the decode
        graphs, largest first, into one pool. Out of memory: fewer sizes (the ones
        captured so far), or eager if none; said in the log."""
        self.facts["warm_up_seconds"] = warm_up(self, model, kv_caches, SPLIT_CHOICES)
        triton_sample.warm_up(self.device, vocab)  # the sampler's draw, compiled now
        triton_penalties.warm_up(self.device, vocab)  # and its penalties
        triton_masks.warm_up(self.device, vocab, (torch.float32, self.dtype))  # and masks
        if self.enforce_eager:
            log.info("CUDA graphs off (--enforce-eager): every step runs eagerly")
            return
        t0 = time.perf_counter()  # the GEMV's choice: timed here, before any capture
        picks = choose_at_start(self.gemv, model, self.num_sms, capture_sizes(self.max_num_seqs))
        self.facts["gemv_choice_seconds"] = seconds = time.perf_counter() - t0
        log.info("few-row GEMV (--gemv %s), chosen in %.2f s:%s", self.gemv.mode, seconds,
                 "".join("\n    " + p for p in picks) or " nothing measured")  # fmt: skip
        torch.cuda.synchronize(self.device)
        free0 = torch.cuda.mem_get_info(self.device)[0]
        t0 = time.perf_counter()
        pool = torch.cuda.graph_pool_handle()
        side = torch.cuda.Stream(self.device)

        def cuda_graph(fn: Callable[[], torch.Tensor]) -> tuple[Graph, torch.Tensor]:
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side):
                fn()  # warm-up: Triton's compile, cuBLAS' plans
            torch.cuda.current_stream(self.device).wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                out = fn()
            return graph, out

        graphs = self.capture(model, kv_caches, cuda_graph)
        if graphs is None:
            return
        torch.cuda.synchronize(self.device)
        seconds = time.perf_counter() - t0
        graph_bytes = free0 - torch.cuda.mem_get_info(self.device)[0]
        self.facts.update(graph_capture_seconds=seconds, graphs_bytes=float(graph_bytes))
        sizes = [sorted(x.graphs) if x else [] for x in (graphs, self.mixed)]
        log.info(
            "CUDA graphs: %d decode sizes (%s) and mixed steps of %s tokens, captured in "
            "%.1f s, %.0f MiB",
            len(sizes[0]), ",".join(map(str, sizes[0])), ",".join(map(str, sizes[1])) or "no",
            seconds, graph_bytes / (1 << 20),
        )  # fmt: skip

    def capture(
        self, model: torch.nn.Module, kv_caches: list[KVCache], make_graph: MakeGraph
    ) -> DecodeGraphs | None:
        """One graph per bucket (make_graph: capture a step, return the graph and its
        output), largest first. Out of memory: the sizes captured so far, or None."""
        self.mixed = None
        sizes = capture_sizes(self.max_num_seqs)
        max_blocks = table_width(-(-self.max_model_len // self.block_size))
        inputs = StaticDecodeInputs(
            max(sizes), max_blocks, self.device, self.scratch_block, self.block_size
        )

        def make_meta(b: int) -> AttentionMetadata:
            return inputs.meta(b, "triton", 0, self.splits(b))

        graphs = DecodeGraphs(inputs, sizes, make_meta)
        if not graphs.capture(model, kv_caches, make_graph):
            if not graphs.graphs:
                log.warning("out of GPU memory capturing decode graphs: every step runs eagerly")
                return None
            log.warning(
                "out of GPU memory capturing decode graphs: kept %d sizes up to %d rows; "
                "larger decode steps run eagerly",
                len(graphs.graphs),
                graphs.max_size,
            )
        self.graphs = graphs
        if len(graphs.graphs) == len(sizes):  # no memory left for more otherwise
            self.mixed = capture_mixed_graphs(
                model, kv_caches, make_graph,
                dict(max_blocks=max_blocks, device=self.device,
                     scratch_block=self.scratch_block, block_size=self.block_size),
                self.max_num_seqs, self.max_num_batched_tokens,
            )  # fmt: skip
        return graphs

    # ---- a step ---------------------------------------------------------------
    def execute(self, model, kv_caches, seqs, argmax_vocab=None):
        clock = self.clock
        started = clock.start(self.chained) if clock is not None else None
        g = self.graphs
        if isinstance(seqs, DecodeRows) and (g is None or len(seqs) > g.max_size):
            seqs = seqs.seqs()  # eager: past the largest graph, or no graphs
        with torch.inference_mode():
            if g is not None and len(seqs) <= g.max_size and decode_only(seqs):
                out = g.replay(seqs, self.prev_tokens)
            elif self.mixed is not None and self.mixed.fits(seqs):
                out = self.mixed.replay(seqs, self.prev_tokens)
            else:
                out = super().execute(model, kv_caches, seqs, argmax_vocab)
        if clock is not None and started is not None:
            clock.end(started)
        return out

    def prepare(self, seqs: StepInputs) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
        """Varlen metadata for the Triton kernels: per sequence, in the step's order, its
        query rows, its context after the step and its block table; a decode-only step
        also gets the decode kernel's (eager: past the largest graph, --enforce-eager)."""
        if isinstance(seqs, DecodeRows):
            seqs = seqs.seqs()
        bs, dev = self.block_size, self.device
        num_decode = sum(1 for s in seqs if len(s.token_ids) == 1)
        t, k = sum(len(s.token_ids) for s in seqs), len(seqs)
        width = table_width(max(-(-(s.num_computed + len(s.token_ids)) // bs) for s in seqs))
        ids, pos, slots, prev = (np.empty(t, dtype=np.int64) for _ in range(4))
        qs, lens, rows = (np.empty(n, dtype=np.int64) for n in (k + 1, k, k))
        tables = np.full((k, width), self.scratch_block, dtype=np.int64)
        _, sampled = write_varlen(
            seqs, bs, VarlenColumns(ids, pos, slots, prev, qs, lens, rows, tables)
        )

        def put(values: np.ndarray, dtype=torch.long) -> torch.Tensor:
            return to_device(torch.from_numpy(values).to(dtype), dev)

        lens_t = put(lens, torch.int32)
        tables_t = put(tables, torch.int32)
        meta = AttentionMetadata(
            slot_mapping=put(slots),
            num_decode=num_decode,
            logits_indices=put(rows[:sampled]),
            decode_kernel="triton",
            query_start_loc=put(qs, torch.int32),
            seq_lens=lens_t,
            block_tables=tables_t,
            max_query_len=max(len(s.token_ids) for s in seqs),
        )
        if num_decode == t:
            meta.decode_block_tables, meta.decode_context_lens = tables_t, lens_t
            meta.num_splits = self.splits(num_decode)
        ids_t = put(ids)
        self.resolve_prev(ids_t, prev.tolist())
        return ids_t, put(pos), meta
