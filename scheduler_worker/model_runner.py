"""Runs the model over one step's worth of sequences on the paged KV cache.

The runner knows nothing of requests or scheduling: it is handed, for each sequence,
the token ids to compute this step, how many of the sequence's tokens are already in
the cache, and the block table; it returns the logits of each sequence's last token.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from common.config import CacheConfig, ConfigError, EngineConfig
from common.log import get_logger
from common.model_facts import context_length
from scheduler_worker import kernels
from scheduler_worker.attention import (
    PAGED_PREFILL_MAX_CONTEXT,
    AttentionMetadata,
    PrefillSlice,
    choose_decode_kernel,
)
from scheduler_worker.kernels.shapes import decode_ops_refusal
from scheduler_worker.kv_pool import allocate_kv_pool
from scheduler_worker.loader import _DTYPES, load, resolve_device, resolve_dtype
from scheduler_worker.quant.linear import QuantLinear, StepRows
from scheduler_worker.quant.plan import kernel_path

__all__ = ["_DTYPES", "ModelRunner", "SeqInput", "resolve_device", "resolve_dtype"]

log = get_logger("model_runner")


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

    def fill(self, seqs: list[SeqInput], bucket_width: bool) -> int:
        """Write the rows of `seqs` (all decodes); returns the block-table width used."""
        n, bs = len(seqs), self.block_size
        ctx_max = max(s.num_computed for s in seqs) + 1
        w = -(-ctx_max // bs)
        w = width_bucket(w) if bucket_width else w
        if n > self.rows or w > self.width:
            self._grow(max(n, 2 * self.rows) if n > self.rows else 0, width_bucket(w))
        ids, pos, slots, ctx, tables = self.np
        tables[:n, :w] = 0
        for i, s in enumerate(seqs):
            p = s.num_computed
            table = s.block_table[:w]
            if len(s.block_table) * bs <= p:
                raise ValueError(
                    f"block table covers {len(s.block_table) * bs} tokens, need {p + 1}"
                )
            ids[i], pos[i], ctx[i] = s.token_ids[0], p, p + 1
            slots[i] = table[p // bs] * bs + p % bs
            tables[i, : len(table)] = table
        return w


# the most the default KV budget grows to for one sequence of the model's context (GiB)
KV_GROW_LIMIT_GB = 2.0


@dataclass
class SeqInput:
    token_ids: list[int]  # tokens to compute this step (1 for a decode)
    num_computed: int  # tokens of this sequence already in the KV cache
    block_table: list[int]  # must cover num_computed + len(token_ids) tokens
    sample: bool = True  # compute logits for the last token (False: a mid-prompt chunk)
    # logits of this many leading tokens as well (prompt logprobs; execute_with_prompt_logits)
    prompt_logits: int = 0


class ModelRunner:
    def __init__(self, config: EngineConfig, model_dir: Path) -> None:
        self.config = config
        loaded = load(config, model_dir)  # scheduler_worker.loader: weights, quantization
        self.model, self.args, self.weights = loaded.model, loaded.args, loaded.plan
        self.device, self.dtype, self.weight_memory = loaded.device, loaded.dtype, loaded.memory
        self.step_rows = StepRows()  # which rows of a step the integer kernels take
        for mod in self.model.modules():
            if isinstance(mod, QuantLinear):
                mod.step_rows = self.step_rows
        self.kernel_isa = self._kernel_isa()  # the one path every C++ op takes; None: torch
        self.use_kernels = self.kernel_isa is not None
        self.isa_index = 0 if self.kernel_isa is None else kernels.isa_index(self.kernel_isa)
        self.decode_kernel = choose_decode_kernel(self.device, self.dtype, paged=self.use_kernels)
        if self.use_kernels:
            for mod in self.model.modules():
                if hasattr(mod, "fused"):
                    setattr(mod, "fused", True)  # noqa: B010 (a plain attribute, not a tensor)
                    setattr(mod, "isa", self.isa_index)  # noqa: B010
            enable = getattr(self.model, "enable_decode_layers", None)
            if enable is not None and enable():
                log.info("decode steps on the integer kernels: all layers in one C++ call")
            elif enable is not None and self.weights.method != "none":
                log.info(
                    "decode steps through the modules, not one C++ call: some decoder "
                    "linear (or part of one) has no kernel (see the weights lines)"
                )
        log.info("decode attention: %s", self.decode_kernel)
        self.kv_dtype = self._kv_dtype()
        self.block_size = config.cache.block_size
        self.num_blocks = self._num_blocks()
        # one block more than the block manager hands out: the scratch block, the placeholder
        # a sliding-window request's table holds for the blocks it gave back (never read:
        # every windowed layer masks it out; scheduler.placeholder_block)
        shape = (self.num_blocks + 1, self.block_size, self.args.num_kv_heads, self.args.head_dim)
        self.kv_caches = allocate_kv_pool(self.args.num_layers, shape, self.kv_dtype, self.device)
        # decode-only steps from kept buffers (their numpy views need the CPU)
        self.decode_inputs = DecodeInputs(self.block_size) if self.device.type == "cpu" else None

    def _kv_dtype(self) -> torch.dtype:
        """The KV cache's element type (--kv-cache-dtype). auto: float16 under a float32
        model whose decode attention is the C++ paged kernel, as llama.cpp keeps its cache:
        at 32 streams that kernel reads every cached K/V row of every layer each step, from
        memory, and half the bytes is most of its time (docs/benchmarks.md); float16's
        11-bit mantissa keeps the scores within ~1e-3. Else the model's dtype. A type other
        than the model's needs the paged kernel (the torch paths read the cache as is)."""
        want = self.config.cache.kv_cache_dtype
        paged_f32 = self.decode_kernel == "paged" and self.dtype == torch.float32
        if want == "auto":
            dtype = torch.float16 if paged_f32 else self.dtype
        else:
            dtype = _DTYPES[want]
            if dtype != self.dtype and not (dtype == torch.float16 and paged_f32):
                raise ConfigError(
                    f"--kv-cache-dtype {want} with a {str(self.dtype).removeprefix('torch.')} "
                    f"model needs the C++ paged decode kernel and a float32 model (float16 "
                    f"cache); this model decodes with '{self.decode_kernel}': use "
                    "--kv-cache-dtype auto"
                )
        log.info("KV cache: %s", str(dtype).removeprefix("torch."))
        return dtype

    def _kernel_isa(self) -> str | None:
        """The C++ decode ops (attention, norms, activation) serve float32/bfloat16 CPU
        models unless --kernels torch asks for pure torch, on the same ISA path as the
        quantized linears (--kernels, ZEROSERVE_CPU_KIND); None for pure torch."""
        if self.device.type != "cpu" or self.dtype not in (torch.float32, torch.bfloat16):
            return None
        isa = self.weights.isa or kernel_path(self.config.model.kernels)
        a = self.args
        why = decode_ops_refusal(a.num_heads, a.num_kv_heads, a.head_dim)
        if isa is not None and why is not None:
            log.warning("C++ decode ops off (%s): attention, norms and RoPE in pure torch", why)
            return None
        return isa

    @property
    def vocab_size(self) -> int:
        return self.args.vocab_size

    def _num_blocks(self) -> int:
        """The KV pool's blocks: --num-kv-blocks, else the memory budget. Under the default
        budget a pool too small for one sequence of the model's own context (Gemma 3's
        32,768 tokens need 1.2 GB in float32) grows to hold exactly one, up to
        KV_GROW_LIMIT_GB, so a downloaded file serves with default flags; past that, or
        with a budget or context the user set, the scheduler refuses to start and says
        which flag to change (worker.check_kv_pool)."""
        cache = self.config.cache
        if cache.num_blocks is not None:
            return cache.num_blocks
        per_block = self.args.kv_bytes_per_token(self.kv_dtype) * self.block_size
        blocks = max(1, int(cache.kv_cache_memory_gb * (1 << 30)) // per_block)
        context = context_length(self.args.hf_config, self.config.model.max_model_len)
        need = -(-context // self.block_size)
        default = CacheConfig.__dataclass_fields__["kv_cache_memory_gb"].default
        if (
            blocks < need
            and cache.kv_cache_memory_gb == default
            and self.config.model.max_model_len is None
            and need * per_block <= KV_GROW_LIMIT_GB * (1 << 30)
        ):
            log.info(
                "KV pool: %.2f GiB to hold one sequence of the model's context (%d tokens), "
                "above the default %.1f GiB (--kv-cache-memory-gb or --max-model-len to change)",
                need * per_block / (1 << 30),
                context,
                default,
            )
            return need
        return blocks

    def prepare(self, seqs: list[SeqInput]) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
        """Flatten the step's tokens (decodes first) and build the attention metadata.

        Returns (input_ids, positions, metadata); metadata.logits_indices lists the last
        token of each sequence with `sample` set, in the order of `seqs`.
        """
        if self.decode_inputs is not None and all(len(s.token_ids) == 1 for s in seqs):
            return self._prepare_decode(self.decode_inputs, seqs)
        bs = self.block_size
        order = _order(seqs)
        num_decode = sum(1 for s in seqs if len(s.token_ids) == 1)
        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        last_index = [0] * len(seqs)
        prefills: list[PrefillSlice] = []
        for i in order:
            s = seqs[i]
            start, n = s.num_computed, len(s.token_ids)
            table = s.block_table
            if len(table) * bs < start + n:
                raise ValueError(f"block table covers {len(table) * bs} tokens, need {start + n}")
            offset = len(input_ids)
            input_ids.extend(s.token_ids)
            positions.extend(range(start, start + n))
            slots.extend(table[p // bs] * bs + p % bs for p in range(start, start + n))
            last_index[i] = offset + n - 1 if s.sample else -1
            if n != 1:
                prefills.append(self._prefill_slice(offset, n, start, table))
        dev = self.device
        meta = AttentionMetadata(
            slot_mapping=torch.tensor(slots, dtype=torch.long, device=dev),
            num_decode=num_decode,
            prefills=prefills,
            logits_indices=torch.tensor(
                [i for i in last_index if i >= 0], dtype=torch.long, device=dev
            ),
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
            meta.decode_block_tables = torch.tensor(tables, dtype=torch.long, device=dev)
            ctx_t = torch.tensor(ctx, dtype=torch.long, device=dev)
            meta.decode_context_lens = ctx_t
            meta.decode_max_context = max(ctx)
            if self.decode_kernel != "paged":
                meta.decode_mask = (
                    torch.arange(max_blocks * bs, device=dev)[None, :] < ctx_t[:, None]
                ).view(num_decode, 1, 1, -1)
        ids = torch.tensor(input_ids, dtype=torch.long, device=dev)
        pos = torch.tensor(positions, dtype=torch.long, device=dev)
        if self.decode_kernel == "paged":
            _paged_rows(meta, [seqs[i] for i in order], bs, pos)
        return ids, pos, meta

    def _prepare_decode(
        self, buf: DecodeInputs, seqs: list[SeqInput]
    ) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
        """prepare() for a decode-only step, from the kept buffers."""
        w = buf.fill(seqs, self.decode_kernel == "paged")
        n = m = len(seqs)
        if all(s.sample for s in seqs):
            logits_indices = buf.rows_index[:n]
        else:
            logits_indices = torch.tensor([i for i, s in enumerate(seqs) if s.sample])
        ctx_t = buf.ctx[:m]
        meta = AttentionMetadata(
            slot_mapping=buf.slots[:m],
            num_decode=m,
            logits_indices=logits_indices,
            decode_kernel=self.decode_kernel,
            kernel_isa=self.isa_index,
            decode_block_tables=buf.tables[:m, :w],
            decode_context_lens=ctx_t,
            decode_max_context=max(s.num_computed for s in seqs) + 1,
        )
        if self.decode_kernel != "paged":
            cols = w * self.block_size
            meta.decode_mask = (torch.arange(cols)[None, :] < ctx_t[:, None]).view(m, 1, 1, -1)
        return buf.ids[:m], buf.pos[:m], meta

    def _prefill_slice(self, offset: int, n: int, start: int, table: list[int]) -> PrefillSlice:
        p = PrefillSlice(start=offset, end=offset + n, num_context=start + n)
        if start == 0:
            return p  # whole context is this chunk: causal attention on the fresh K/V
        dev = self.device
        nblocks = (start + n + self.block_size - 1) // self.block_size
        p.block_ids = torch.tensor(table[:nblocks], dtype=torch.long, device=dev)
        q_pos = torch.arange(start, start + n, device=dev)
        p.mask = torch.arange(start + n, device=dev)[None, :] <= q_pos[:, None]
        return p

    @torch.inference_mode()
    def execute(self, seqs: list[SeqInput], argmax_vocab: int | None = None) -> torch.Tensor:
        """Run one forward; returns float32 logits [num sampling seqs, vocab]. With
        `argmax_vocab` (the caller takes every row's argmax of the raw logits: a greedy
        step), int64 tokens [num sampling seqs] instead where the model's head takes the
        argmax of the first argmax_vocab logits itself (CausalLM.greedy_tokens): Gemma 3's
        262k-token logits, 33.5 MB a step at 32 rows, are then never written or read back."""
        input_ids, positions, meta = self.prepare(seqs)
        self.step_rows.set_step(meta.num_decode)
        hidden = self.model(input_ids, positions, self.kv_caches, meta)[meta.logits_indices]
        if argmax_vocab is not None:
            tokens = self.model.greedy_tokens(hidden, argmax_vocab)
            if tokens is not None:
                return tokens
        return self.model.compute_logits(hidden).float()

    @torch.inference_mode()
    def execute_with_prompt_logits(
        self, seqs: list[SeqInput]
    ) -> tuple[torch.Tensor, list[torch.Tensor | None]]:
        """execute(), plus per sequence the float32 logits [prompt_logits, vocab] of its
        first `prompt_logits` tokens (None where 0): position p's row scores token p + 1.
        A step whose requests ask for no prompt logprobs takes execute() instead."""
        input_ids, positions, meta = self.prepare(seqs)
        self.step_rows.set_step(meta.num_decode)
        hidden = self.model(input_ids, positions, self.kv_caches, meta)
        logits = self.model.compute_logits(hidden[meta.logits_indices]).float()
        extra: list[torch.Tensor | None] = [None] * len(seqs)
        offset = 0
        for i in _order(seqs):
            k = seqs[i].prompt_logits
            if k > 0:
                extra[i] = self.model.compute_logits(hidden[offset : offset + k]).float()
            offset += len(seqs[i].token_ids)
        return logits, extra


def _order(seqs: list[SeqInput]) -> list[int]:
    """The order of the sequences' tokens in a step: decodes (one token) first."""
    return sorted(range(len(seqs)), key=lambda i: len(seqs[i].token_ids) != 1)


def _paged_rows(meta: AttentionMetadata, seqs: list[SeqInput], bs: int, pos: torch.Tensor) -> None:
    """Marks the step's short prefills (attention.PAGED_PREFILL_MAX_CONTEXT) `paged` and sets
    the kernel's rows (`AttentionMetadata.row_*`): theirs and the decodes'. `seqs` in the
    step's token order, `pos` the tokens' positions."""
    short = [p for p in meta.prefills if p.num_context <= PAGED_PREFILL_MAX_CONTEXT]
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
        if n == 1 or s.num_computed + n <= PAGED_PREFILL_MAX_CONTEXT:
            table = s.block_table[:width]
            row = torch.tensor(table + [0] * (width - len(table)), dtype=torch.long)
            tables.append(row.expand(n, width))
            index.append(torch.arange(offset, offset + n))
        offset += n
    rows = torch.cat(index)
    meta.row_block_tables = torch.cat(tables).to(pos.device)
    if rows.numel() == pos.numel():
        meta.row_context_lens = pos + 1
    else:
        meta.row_index = rows.to(pos.device)
        meta.row_context_lens = pos.index_select(0, meta.row_index) + 1
