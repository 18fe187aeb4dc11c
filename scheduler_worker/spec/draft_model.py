"""Drafts from a second, smaller model with the same tokenizer (--speculative-model).

The draft model runs as its own LLMEngine in the scheduler's process: its own weights,
KV pool and prefix cache, no drafts of its own. A proposal is one greedy request to it
over the row's tokens, k tokens long: its prefix cache holds the row's earlier tokens
(every full block of the last proposal's request), so a proposal computes the row's
newest tokens (at most a block and the last accepted run) and k - 1 one-token steps.
Point-mass drafts: greedy rows verify them by argmax, sampled rows by rejection sampling
(sampled.py), so the target's output distribution is the draft model's business only
through how many drafts it accepts.

Rows draft one after another (a batched proposal over every row of a step is the next
step); the adaptive policy (policy.py) times steps with their drafting, so a draft model
that costs more than it saves at a batch size is switched off there.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from common.config import ConfigError, EngineConfig
from common.log import get_logger
from common.model_files.tokenizer_files import same_tokenizer
from common.sampling_params import InvalidParameterError, SamplingParams

log = get_logger("spec.draft_model")


def draft_config(config: EngineConfig, num_blocks: int) -> EngineConfig:
    """The draft engine's: the target's device and threads, the draft model's own dtype,
    quantization and context, as many KV blocks as the target (the same tokens: a smaller
    model's blocks are smaller), prefix caching on, one process, no speculation."""
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
            max_num_seqs=1,
            max_decode_batch=None,
        ),
    )


class DraftModelDrafter:
    """A drafter (spec/__init__.py's Drafter) over a draft LLMEngine."""

    def __init__(self, engine: Any, target_vocab: int) -> None:  # an LLMEngine (no import:
        # the engine imports the scheduler, which imports this)
        self.engine = engine
        self.target_vocab = target_vocab
        self._ids = itertools.count()
        self.num_proposals = 0
        self.num_refused = 0  # proposals the draft engine could not hold (context, pool)
        self.num_computed = 0  # prompt tokens the draft computed (its prefix cache: not all)

    @classmethod
    def build(
        cls,
        make_engine: Callable[[EngineConfig], Any],
        config: EngineConfig,
        num_blocks: int,
        target_dir: Path,
        target_vocab: int,
    ) -> DraftModelDrafter:
        engine = make_engine(draft_config(config, num_blocks))  # the LLMEngine class
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
        return cls(engine, target_vocab)

    def propose(
        self, token_ids: list[int], state: object | None, k: int
    ) -> tuple[list[int], object | None]:
        if k <= 0:
            return [], None
        self.num_proposals += 1
        rid = f"draft-{next(self._ids)}"
        params = SamplingParams(max_tokens=k, temperature=0.0)
        try:
            self.engine.add_request(rid, token_ids, params)
        except InvalidParameterError:  # past the draft's context or pool: no drafts
            self.num_refused += 1
            return [], None
        drafts: list[int] = []
        while self.engine.has_unfinished():
            for out in self.engine.step():
                if out.request_id == rid:
                    drafts.extend(out.new_token_ids)
                    if out.finish_reason is not None:
                        self.num_computed += len(token_ids) - out.num_cached_tokens
        # a larger draft vocabulary may name ids the target has not: drafts end there
        cut = next((i for i, t in enumerate(drafts) if t >= self.target_vocab), len(drafts))
        return drafts[:cut], None

    def observe(self, prompt_token_ids: list[int], output_token_ids: list[int]) -> None:
        """Nothing: the draft engine's prefix cache keeps what it has seen."""


class ChainDrafter:
    """The cheaper drafter first (ngram, suffix); the draft model where it has none."""

    def __init__(self, first, then: DraftModelDrafter) -> None:
        self.first, self.then = first, then

    def propose(
        self, token_ids: list[int], state: object | None, k: int
    ) -> tuple[list[int], object | None]:
        drafts, state = self.first.propose(token_ids, state, k)
        if drafts:
            return drafts, state
        return self.then.propose(token_ids, None, k)[0], state

    def observe(self, prompt_token_ids: list[int], output_token_ids: list[int]) -> None:
        self.first.observe(prompt_token_ids, output_token_ids)
