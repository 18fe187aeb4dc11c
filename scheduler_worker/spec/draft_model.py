"""Drafts from a second, smaller model with the same tokenizer (--speculative-model).

The draft model is loaded as its own LLMEngine in the scheduler's process (its weights,
KV pool and prefix cache); only its runner and block manager are used. Each drafting
row keeps a live sequence in its pool (draft_seqs.py: rolled back to what the target
accepted, never re-admitted), and a step's rows draft together (ModelDrafter.fill):

    step 1     every row's tokens since its last proposal (the accepted run and the
               target's token; the whole prompt at first, chunked) -> d1 per row; a
               short run as one decode row a token where the backend verifies so
               (spec/verify_rows.py: the decode kernels, not the prompt path's)
    step j>1   one decode row per row still drafting, d(j-1) -> dj   (k - 1 steps)

so k forwards of the draft model a step, whatever the number of rows. Point-mass drafts:
greedy rows verify them by argmax, sampled rows by rejection sampling (sampled.py), so
the target's output distribution is the draft model's business only through how many
drafts it accepts. The adaptive policy (policy.py) times steps with their drafting, so a
draft model that costs more than it saves at a batch size is switched off there.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from common.config import ConfigError, EngineConfig
from common.log import get_logger
from common.model_files.tokenizer_files import same_tokenizer
from scheduler_worker.backends.base import DecodeRows, SeqInput, StepInputs
from scheduler_worker.spec.draft_seqs import DraftSeq, DraftSeqs
from scheduler_worker.spec.drafter import Drafter, ModelDrafter
from scheduler_worker.spec.verify_rows import expand, placement

if TYPE_CHECKING:
    from scheduler_worker.model_runner import ModelRunner
    from scheduler_worker.request import Request

log = get_logger("spec.draft_model")

SHORT_RUN = 16  # a catch-up of at most this many tokens runs as decode rows (step 1)


def draft_config(config: EngineConfig, num_blocks: int, num_seqs: int) -> EngineConfig:
    """The draft engine's: the target's device and threads, the draft model's own dtype,
    quantization and context, as many KV blocks as the target (the same tokens: a smaller
    model's blocks are smaller), the target's rows (a GPU captures its decode graphs up
    to them), prefix caching on, one process, no speculation."""
    model = config.scheduler.speculative_model
    assert model is not None
    return replace(
        config,
        model=replace(
            config.model,
            model=model,
            dtype="auto",
            quantization="auto",
            max_model_len=None,
            tensor_parallel_size=1,
        ),
        cache=replace(config.cache, num_blocks=num_blocks, enable_prefix_caching=True),
        scheduler=replace(
            config.scheduler,
            speculative_method="none",
            speculative_model=None,
            max_num_seqs=num_seqs,
            max_decode_batch=None,
        ),
    )


class DraftModelDrafter(ModelDrafter):
    """A ModelDrafter over a draft LLMEngine's runner and KV pool."""

    def __init__(
        self, engine: Any, target_vocab: int, num_seqs: int, chunk: int, first: Drafter | None
    ) -> None:  # engine: an LLMEngine (no import: the engine imports the scheduler, this)
        super().__init__(first)
        self.engine, self.runner = engine, engine.runner
        # drafts name ids both models have (a larger draft vocabulary's extra ids: never)
        self.vocab = min(target_vocab, engine.runner.vocab_size)
        self.max_len = engine.max_model_len
        self.chunk = chunk  # a step's catch-up tokens over all rows, at most
        self.kv = DraftSeqs(engine.block_manager, num_seqs)
        self.num_proposals = 0  # rows asked for drafts
        self.num_refused = 0  # of those, rows the draft could not hold (context, pool)
        self.num_computed = 0  # catch-up tokens the draft computed (not the drafts)
        self.num_forwards = 0

    @classmethod
    def build(
        cls,
        make_engine: Callable[[EngineConfig], Any],
        config: EngineConfig,
        runner: ModelRunner,
        target_dir: Path,
        first: Drafter | None = None,
    ) -> DraftModelDrafter:
        sched = config.scheduler.resolved(runner.backend.name)
        engine = make_engine(draft_config(config, runner.num_blocks, sched.num_seqs))
        why = same_tokenizer(target_dir, engine.model_dir)
        if why is not None:
            raise ConfigError(
                f"--speculative-model {config.scheduler.speculative_model}: {why}; the draft "
                "model must share the served model's tokenizer"
            )
        log.info(
            "draft model %s: %d KV blocks, context %d",
            engine.model_dir.name,
            engine.runner.num_blocks,
            engine.max_model_len,
        )
        return cls(engine, runner.vocab_size, sched.num_seqs, sched.num_batched_tokens, first)

    def propose_batch(self, rows: list[tuple[Request, int]]) -> list[list[int]]:
        out: list[list[int]] = [[] for _ in rows]
        chunks: list[SeqInput] = []
        going: list[tuple[int, DraftSeq, int]] = []  # (row, its sequence, its k)
        budget = self.chunk
        for i, (req, k) in enumerate(rows):
            self.num_proposals += 1
            tokens = req.token_ids
            k = min(k, self.max_len + 1 - len(tokens))  # d(k-1)'s position < max_len
            if k <= 0 or budget <= 0:
                self.num_refused += 1
                continue
            seq = self.kv.sync(req.request_id, tokens)
            start = seq.num_computed
            take = min(len(tokens) - start, budget)
            whole = start + take == len(tokens)  # else a prompt chunk: no drafts yet
            if not self.kv.reserve(seq, start + take + (k - 1 if whole else 0)):
                self.num_refused += 1
                continue
            chunks.append(SeqInput(tokens[start : start + take], start, seq.block_table, whole))
            seq.num_computed = seq.known = start + take
            budget -= take
            self.num_computed += take
            if whole:
                going.append((i, seq, k))
        if not chunks:
            return out
        for (i, _, _), token in zip(going, self._catch_up(chunks)):
            out[i].append(token)
        live = [g for g in going if g[2] > 1]
        while live:
            rows_in = DecodeRows(
                [out[i][-1] for i, _, _ in live],
                [seq.num_computed for _, seq, _ in live],
                [seq.slot for _, seq, _ in live],
                [-1] * len(live),
                self.kv.tables,
            )
            for (i, seq, _), token in zip(live, self._run(rows_in)):
                seq.drafts.append(out[i][-1])  # its K/V is written now
                seq.num_computed += 1
                out[i].append(token)
            live = [g for g in live if len(out[g[0]]) < g[2]]
        return out

    def _catch_up(self, chunks: list[SeqInput]) -> list[int]:
        """Step 1's forward: the argmax after each sampled chunk, in order."""
        if not self.runner.backend.verify_as_decode_rows:
            return self._run(chunks)
        for c in chunks:  # as decode rows: a row's logits at every token, the last one kept
            c.verify = c.sample and len(c.token_ids) <= SHORT_RUN
        tokens = self._run(expand(chunks))
        return [tokens[first + n - 1] for _, first, n in placement(chunks) if n]

    def _run(self, inputs: StepInputs) -> list[int]:
        """One forward of the draft model: each sampled row's argmax."""
        self.num_forwards += 1
        result = self.runner.execute(inputs, self.vocab)
        if result.dtype != torch.long:  # logits: the head took no argmax itself
            result = result[:, : self.vocab].argmax(dim=-1)
        return result.tolist()

    def live(self, req: Request) -> bool:
        return req.request_id in self.kv.seqs

    def drop(self, req: Request) -> None:
        self.kv.drop(req.request_id)
