"""Runs the model over one step's worth of sequences on the paged KV cache.

The runner knows nothing of requests or scheduling: it is handed, for each sequence,
the token ids to compute this step, how many of the sequence's tokens are already in
the cache, and the block table; it returns the logits of each sequence's last token.
What differs between devices (op set, KV pool, step inputs, graphs) is its backend's
(scheduler_worker/backends/).
"""

from __future__ import annotations

from pathlib import Path

import torch

from common.config import CacheConfig, ConfigError, EngineConfig
from common.log import get_logger
from common.model_facts import context_length
from scheduler_worker.attention import AttentionMetadata
from scheduler_worker.backends.base import SeqInput, StepInputs, step_order
from scheduler_worker.backends.device import TORCH_DTYPES, resolve_device, resolve_dtype
from scheduler_worker.backends.select import ModelShape, make_backend
from scheduler_worker.loader import load
from scheduler_worker.parallel.group import tp_group
from scheduler_worker.parallel.step_channel import EXECUTE, PROMPT_LOGITS, StepChannel
from scheduler_worker.quant.linear import QuantLinear, StepRows
from scheduler_worker.spec.verify_rows import expand, placement, token_offsets

__all__ = ["TORCH_DTYPES", "ModelRunner", "SeqInput", "resolve_device", "resolve_dtype"]

log = get_logger("model_runner")

# the most the default KV budget grows to for one sequence of the model's context (GiB)
KV_GROW_LIMIT_GB = 2.0


class ModelRunner:
    def __init__(self, config: EngineConfig, model_dir: Path) -> None:
        self.config = config
        if config.model.num_threads is not None:  # the offline engine too, not only the worker
            torch.set_num_threads(config.model.num_threads)
        # tensor parallelism (scheduler_worker/parallel/): this rank's shard; rank 0 sends
        # each step to the other ranks, which make the same calls (parallel/follower.py)
        self.tp = tp_group()
        self.channel = StepChannel(self.tp) if self.tp is not None and self.tp.rank == 0 else None
        loaded = load(config, model_dir)  # scheduler_worker.loader: weights, quantization
        self.model, self.args, self.weights = loaded.model, loaded.args, loaded.plan
        self.device, self.dtype, self.weight_memory = loaded.device, loaded.dtype, loaded.memory
        self.step_rows = StepRows()  # which rows of a step the integer kernels take
        for mod in self.model.modules():
            if isinstance(mod, QuantLinear):
                mod.step_rows = self.step_rows
        self.max_model_len = context_length(self.args.hf_config, config.model.max_model_len)
        a = self.args
        facts = ModelShape(
            self.device, self.dtype, a.num_heads, a.num_kv_heads, a.head_dim, self.weights.isa
        )
        self.backend = make_backend(config, facts, self.step_rows, self.max_model_len)
        self.kernel_isa = self.backend.kernel_isa  # C++ path; None: none
        self.use_kernels = self.kernel_isa is not None
        self.isa_index = self.backend.isa_index
        self.decode_kernel = self.backend.decode_kernel
        self.use_ops(self.backend.ops)
        if self.use_kernels:
            if self.model.enable_decode_layers():
                log.info("decode steps on the integer kernels: all layers in one C++ call")
            elif self.weights.method != "none" and self.backend.ops.one_call_decode:
                log.info(
                    "decode steps through the modules, not one C++ call: some decoder "
                    "linear (or part of one) has no kernel (see the weights lines)"
                )
        log.info("decode attention: %s (backend %s)", self.decode_kernel, self.backend.name)
        self.kv_dtype = self.backend.kv_cache_dtype(config.cache.kv_cache_dtype)
        log.info("KV cache: %s", str(self.kv_dtype).removeprefix("torch."))
        self.block_size = config.cache.block_size
        self.num_blocks = self._num_blocks()
        if self.tp is not None:  # every rank's pool holds the same blocks (its heads' part)
            self.num_blocks = self.tp.min_int(self.num_blocks)
        # one block more than the block manager hands out: the scratch block, the placeholder
        # a sliding-window request's table holds for the blocks it gave back (never read:
        # every windowed layer masks it out; scheduler.placeholder_block), and where a
        # padded graph row writes its K/V
        shape = (self.num_blocks + 1, self.block_size, self.args.num_kv_heads, self.args.head_dim)
        self.kv_caches = self.backend.allocate_kv_pool(self.args.num_layers, shape, self.kv_dtype)
        self.backend.start(self.model, self.kv_caches, self.args.vocab_size)

    def use_ops(self, ops) -> None:
        """Every layer module that calls an op set calls `ops` (the backend's; tests and
        benchmarks set another on the same model)."""
        for mod in self.model.modules():
            if hasattr(mod, "ops"):
                setattr(mod, "ops", ops)  # noqa: B010 (a plain attribute)

    @property
    def vocab_size(self) -> int:
        return self.args.vocab_size

    def _num_blocks(self) -> int:
        """The KV pool's blocks: --num-kv-blocks, else the memory budget. Under the default
        budget a pool too small for one sequence of the model's own context (Gemma 3's
        32,768 tokens need 1.2 GB in float32) grows to hold exactly one, up to
        KV_GROW_LIMIT_GB, so a downloaded file serves with default flags; past that, or
        with a budget or context the user set, the scheduler refuses to start and says
        which flag to change (refusals.check_kv_pool)."""
        cache = self.config.cache
        if cache.num_blocks is not None:
            return cache.num_blocks
        tail = (self.args.num_kv_heads, self.args.head_dim)
        args = (self.model, tail, self.kv_dtype, self.args.num_layers, self.vocab_size)
        blocks = self.backend.profile_kv_blocks(*args)
        if blocks is not None:  # a GPU: what --gpu-memory-utilization leaves
            if blocks < 1:
                raise ConfigError(
                    "no GPU memory left for the KV cache after the weights and a largest "
                    "step: raise --gpu-memory-utilization, or lower --max-num-batched-tokens "
                    "or --max-num-seqs"
                )
            return blocks
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

    def prepare(self, seqs: StepInputs) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
        """The step's flat inputs and attention metadata, built by the backend."""
        return self.backend.prepare(seqs)

    @torch.inference_mode()
    def execute(self, seqs: StepInputs, argmax_vocab: int | None = None) -> torch.Tensor:
        """Run one forward; returns float32 logits [num sampling seqs, vocab]. With
        `argmax_vocab` (the caller takes every row's argmax of the raw logits: a greedy
        step), int64 tokens [num sampling seqs] instead where the model's head takes the
        argmax of the first argmax_vocab logits itself (CausalLM.greedy_tokens): Gemma 3's
        262k-token logits, 33.5 MB a step at 32 rows, are then never written or read back.
        On a GPU the result is on the device and may not be computed yet."""
        if self.channel is not None:
            self.channel.send(EXECUTE, seqs, argmax_vocab)
        return self.backend.execute(self.model, self.kv_caches, seqs, argmax_vocab)

    @torch.inference_mode()
    def execute_with_prompt_logits(
        self, seqs: list[SeqInput], argmax_vocab: int | None = None
    ) -> tuple[torch.Tensor, list[torch.Tensor | None]]:
        """execute() (`argmax_vocab` as there), plus per sequence the float32 logits
        [prompt_logits, vocab] of its first `prompt_logits` tokens (None where 0): position
        p's row scores token p + 1; for a `draft` sequence, int64 tokens [prompt_logits]
        (their argmax over the vocabulary) where the head takes them as execute() does.
        A step with no such sequence takes execute() instead."""
        if self.channel is not None:
            self.channel.send(PROMPT_LOGITS, seqs, argmax_vocab)
        if self.backend.verify_as_decode_rows and any(s.verify for s in seqs):
            return self._verify_as_decode_rows(seqs, argmax_vocab)
        input_ids, positions, meta = self.prepare(seqs)
        self.backend.before_forward(meta)
        hidden = self.model(input_ids, positions, self.kv_caches, meta)
        logits = self._head(hidden[meta.logits_indices], argmax_vocab)
        extra: list[torch.Tensor | None] = [None] * len(seqs)
        offset = 0
        for i in step_order(seqs):
            k = seqs[i].prompt_logits
            if k > 0:
                rows = hidden[offset : offset + k]
                extra[i] = self._head(rows, self.vocab_size if seqs[i].draft else None)
            offset += len(seqs[i].token_ids)
        return logits, extra

    def _verify_as_decode_rows(
        self, seqs: list[SeqInput], argmax_vocab: int | None
    ) -> tuple[torch.Tensor, list[torch.Tensor | None]]:
        """execute_with_prompt_logits with each drafted row as 1 + k decode rows
        (spec/verify_rows.py) and one head call over every sampled row: the argmax where
        every drafted row is plain greedy (`draft`), else the logits."""
        rows = expand(seqs)
        plain = all(s.draft for s in seqs if s.verify)
        head_vocab = argmax_vocab if plain else None
        if not any(s.prompt_logits and not s.verify for s in seqs):  # the common step:
            # the backend's own (the CPU's one call; a GPU's graph of its row count)
            out = self.backend.execute(self.model, self.kv_caches, rows, head_vocab)
            hidden = None
        else:
            input_ids, positions, meta = self.prepare(rows)
            self.backend.before_forward(meta)
            hidden = self.model(input_ids, positions, self.kv_caches, meta)
            out = self._head(hidden[meta.logits_indices], head_vocab)
        extra: list[torch.Tensor | None] = [None] * len(seqs)
        offsets = token_offsets(rows)
        last: list[int] = []
        for i, (s, (row, first, n)) in enumerate(zip(seqs, placement(seqs))):
            if s.verify:
                extra[i] = out[first : first + n - 1]
            elif s.prompt_logits and hidden is not None:  # a chunk's prompt logprobs
                at = offsets[row]
                extra[i] = self._head(hidden[at : at + s.prompt_logits], None)
            if n:
                last.append(first + n - 1)
        logits = out if len(last) == out.shape[0] else out[torch.tensor(last)]
        return logits, extra

    def _head(self, hidden: torch.Tensor, argmax_vocab: int | None) -> torch.Tensor:
        if argmax_vocab is not None:
            tokens = self.model.greedy_tokens(hidden, argmax_vocab)
            if tokens is not None:
                return tokens
        return self.model.compute_logits(hidden).float()
