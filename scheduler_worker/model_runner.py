"""Runs the model over one step's worth of sequences on the paged KV cache.

The runner knows nothing of requests or scheduling: it is handed, for each sequence,
the token ids to compute this step, how many of the sequence's tokens are already in
the cache, and the block table; it returns the logits of each sequence's last token.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import torch

from common.config import EngineConfig
from common.cpu import has_native_bf16
from common.log import get_logger
from common.model_source import check_quantization_source, gguf_source
from scheduler_worker import kernels
from scheduler_worker.attention import (
    AttentionMetadata,
    PrefillSlice,
    choose_decode_kernel,
    paged_kernel_refusal,
)
from scheduler_worker.models import load_model
from scheduler_worker.quant.gguf_weights import GGUFBlocks, gguf_linears
from scheduler_worker.quant.linear import (
    DENSE_ABOVE_ROWS,
    QuantLinear,
    StepRows,
    quantize_model,
    replace_linear,
)
from scheduler_worker.quant.plan import WeightPlan, plan_weights

log = get_logger("model_runner")

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def decode_bucket(n: int) -> int:
    """The batch size a padded decode step runs at: 1, 2, 4, then multiples of 8 (as vLLM
    captures CUDA graphs), so a handful of shapes cover every batch."""
    return n if n <= 2 else 4 if n <= 4 else -(-n // 8) * 8


def width_bucket(n: int) -> int:
    """Block-table width of a decode step: the next power of two."""
    return 1 << max(0, n - 1).bit_length()


class DecodeInputs:
    """The inputs of decode-only steps, kept between steps: each step writes its rows into
    these buffers (through numpy views, no tensor allocated) and the model gets views of
    them. They grow when a step needs more rows or a wider block table, which happens a
    few times per process.

    With `pad`, a step of n sequences runs at decode_bucket(n) rows and a block table
    width_bucket(w) wide: the rows past n decode a dummy token into a scratch KV block that
    no sequence owns, so every decode step has one of a few shapes, as a CUDA graph
    replay needs. The CPU runs unpadded (a padded row costs as much as a real one there)
    but buckets the width when the decode attention is the paged kernel, which reads only
    each row's context."""

    def __init__(self, scratch_block: int, block_size: int) -> None:
        self.scratch_block, self.block_size = scratch_block, block_size
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

    def fill(self, seqs: list[SeqInput], pad: bool, bucket_width: bool) -> int:
        """Write the rows of `seqs` (all decodes) and return the row count to run."""
        n, bs = len(seqs), self.block_size
        m = decode_bucket(n) if pad else n
        ctx_max = max(s.num_computed for s in seqs) + 1
        w = -(-ctx_max // bs)
        w = width_bucket(w) if pad or bucket_width else w
        if m > self.rows or w > self.width:
            self._grow(max(m, 2 * self.rows) if m > self.rows else 0, width_bucket(w))
        ids, pos, slots, ctx, tables = self.np
        tables[:m, :w] = 0
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
        # padding rows: a dummy token at position 0 in the scratch block
        ids[n:m], pos[n:m], ctx[n:m] = 0, 0, 1
        slots[n:m] = self.scratch_block * bs
        tables[n:m, 0] = self.scratch_block
        self.width_used = w
        return m


@dataclass
class SeqInput:
    token_ids: list[int]  # tokens to compute this step (1 for a decode)
    num_computed: int  # tokens of this sequence already in the KV cache
    block_table: list[int]  # must cover num_computed + len(token_ids) tokens
    sample: bool = True  # compute logits for the last token (False: a mid-prompt chunk)
    # logits of this many leading tokens as well (prompt logprobs; execute_with_prompt_logits)
    prompt_logits: int = 0


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("device 'cuda' requested but torch sees no CUDA device")
    return torch.device(name)


def resolve_dtype(name: str, device: torch.device, quantized: bool = False) -> torch.dtype:
    if name != "auto":
        return _DTYPES[name]
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    if quantized:
        # block-quantized linears take float32 activations best on every CPU measured: the
        # kernels quantize them to 8 bits anyway, and the rest of the step (norms, rope,
        # attention) has no casts; large steps still get bf16 GEMMs where those beat the
        # kernels (QuantLinear's dense copy). docs/benchmarks.md, "Decode step".
        return torch.float32
    # CPU: bfloat16 when the CPU has native bf16 matmuls (AVX512-BF16 / AMX), measured
    # faster than float32 for this engine (docs/benchmarks.md); float32 otherwise.
    return torch.bfloat16 if has_native_bf16() else torch.float32


class ModelRunner:
    def __init__(self, config: EngineConfig, model_dir: Path) -> None:
        self.config = config
        self.device = resolve_device(config.model.device)
        check_quantization_source(config.model.quantization, model_dir)
        gguf = gguf_source(model_dir)
        self.weights = plan_weights(config.model, self.device, gguf)
        self.dtype = resolve_dtype(config.model.dtype, self.device, self.weights.method != "none")
        if self.weights.method != "none" and self.dtype not in (torch.float32, torch.bfloat16):
            raise ValueError(f"quantized weights need dtype float32 or bfloat16, not {self.dtype}")
        t0 = time.perf_counter()
        self.model, self.args = load_model(model_dir, self.dtype, self.device)
        log.info(
            "loaded %s (%s, %s) in %.1fs",
            self.args.architecture,
            self.dtype,
            self.device,
            time.perf_counter() - t0,
        )
        self._quantize(self.weights, gguf)
        self.step_rows = StepRows()  # which rows of a step the integer kernels take
        for mod in self.model.modules():
            if isinstance(mod, QuantLinear):
                mod.step_rows = self.step_rows
        self.use_kernels = self._kernels_wanted()
        a = self.args
        refusal = paged_kernel_refusal(a.num_heads, a.num_kv_heads, a.head_dim)
        if self.use_kernels and refusal is not None:
            log.info("decode attention: not the C++ kernel: %s", refusal)
        self.decode_kernel = choose_decode_kernel(
            self.device, self.dtype, paged=self.use_kernels and refusal is None
        )
        if self.use_kernels:
            self.model.apply(lambda m: setattr(m, "fused", True) if hasattr(m, "fused") else None)
            enable = getattr(self.model, "enable_decode_layers", None)
            if enable is not None and enable():
                log.info("decode steps on the integer kernels: all layers in one C++ call")
        log.info("decode attention: %s", self.decode_kernel)
        self.block_size = config.cache.block_size
        self.num_blocks = self._num_blocks()
        # one more block than the block manager hands out: padded decode rows write there
        shape = (self.num_blocks + 1, self.block_size, self.args.num_kv_heads, self.args.head_dim)
        self.kv_caches = [
            (
                torch.zeros(shape, dtype=self.dtype, device=self.device),
                torch.zeros(shape, dtype=self.dtype, device=self.device),
            )
            for _ in range(self.args.num_layers)
        ]
        # decode-only steps from kept buffers (their numpy views need the CPU)
        self.decode_inputs = (
            DecodeInputs(self.num_blocks, self.block_size) if self.device.type == "cpu" else None
        )
        self.pad_decode = False  # bucketed decode shapes (see DecodeInputs); tests turn it on

    def _kernels_wanted(self) -> bool:
        """The C++ decode ops (attention, norms, activation) serve float32/bfloat16 CPU
        models unless --kernels torch asks for pure torch."""
        if self.device.type != "cpu" or self.dtype not in (torch.float32, torch.bfloat16):
            return False
        return self.config.model.kernels != "torch" and kernels.load()

    def _quantize(self, plan: WeightPlan, gguf: Path | None) -> None:
        if plan.method == "none":
            log.info("weights: float %s (%s)", str(self.dtype).removeprefix("torch."), plan.reason)
            return
        t0 = time.perf_counter()
        path = plan.isa or "pure torch (dequantized)"
        if plan.method == "gguf":
            assert gguf is not None
            blocks = GGUFBlocks(gguf)
            found, skipped = gguf_linears(blocks, self.args.num_layers)
            for name, weight in found.items():
                replace_linear(self.model, name, weight, self.dtype, plan.isa, plan.dense_dtype)
            types = ", ".join(f"{n} {t}" for t, n in sorted(blocks.types().items()))
            log.info(
                "weights: %d linears from the GGUF's own blocks (file: %s), kernels %s, "
                "activations %s%s, in %.1fs (%s)",
                len(found),
                types,
                path,
                str(self.dtype).removeprefix("torch."),
                self._dense_note(plan),
                time.perf_counter() - t0,
                plan.reason,
            )
            if skipped:
                log.info(
                    "weights: %d linears keep dequantized float weights (no kernel for "
                    "their GGUF type): %s",
                    len(skipped),
                    ", ".join(skipped[:4]),
                )
            return
        n = quantize_model(self.model, plan.method, self.dtype, plan.isa, plan.dense_dtype)
        log.info(
            "weights: %d linears quantized to %s blocks, kernels %s, activations %s%s, "
            "in %.1fs (%s)",
            n,
            plan.method,
            path,
            str(self.dtype).removeprefix("torch."),
            self._dense_note(plan),
            time.perf_counter() - t0,
            plan.reason,
        )

    @staticmethod
    def _dense_note(plan: WeightPlan) -> str:
        if plan.dense_dtype is None:
            return ""
        return (
            f"; prompt tokens, and decode batches of more than {DENSE_ABOVE_ROWS}, use a dense "
            f"{str(plan.dense_dtype).removeprefix('torch.')} copy (native bf16 GEMMs here)"
        )

    @property
    def vocab_size(self) -> int:
        return self.args.vocab_size

    def _num_blocks(self) -> int:
        cache = self.config.cache
        if cache.num_blocks is not None:
            return cache.num_blocks
        per_block = self.args.kv_bytes_per_token(self.dtype) * self.block_size
        return max(1, int(cache.kv_cache_memory_gb * (1 << 30)) // per_block)

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
        return ids, pos, meta

    def _prepare_decode(
        self, buf: DecodeInputs, seqs: list[SeqInput]
    ) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
        """prepare() for a decode-only step, from the kept buffers."""
        m = buf.fill(seqs, self.pad_decode, self.decode_kernel == "paged")
        n, w = len(seqs), buf.width_used
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
    def execute(self, seqs: list[SeqInput]) -> torch.Tensor:
        """Run one forward; returns float32 logits [num sampling seqs, vocab]."""
        input_ids, positions, meta = self.prepare(seqs)
        self.step_rows.set_step(meta.num_decode)
        hidden = self.model(input_ids, positions, self.kv_caches, meta)
        return self.model.compute_logits(hidden[meta.logits_indices]).float()

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
