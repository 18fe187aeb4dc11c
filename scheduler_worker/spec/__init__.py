"""Speculative decoding's drafting seam: a drafter proposes up to k next tokens for a
request from its own tokens; the scheduler gives the row a (1 + k)-token chunk and the
engine verifies every draft in the step's one batched forward: by argmax for plain greedy
rows (verify.py), by sampling each position for the others (sampled.py).

    method  file       drafts from
    ngram   ngram.py   the request's prompt and output (prompt lookup)
    (any)   prediction.py  the request's OpenAI `prediction`, aligned with its output
    suffix  suffix.py  the same and a bounded store of recent requests' outputs, shared
                       by the scheduler process's requests (observe() feeds it)
    draft   draft_model.py  a second, smaller model with the same tokenizer
                       (--speculative-model; after ngram or suffix where they have none)

A drafter keeps its per-request state on the request (Request.draft_state), so that
it goes with the request through preemption and is dropped when the request is.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from common.config import ConfigError, EngineConfig
from scheduler_worker.spec.ngram import NgramDrafter
from scheduler_worker.spec.suffix import SuffixDrafter

if TYPE_CHECKING:
    from scheduler_worker.model_runner import ModelRunner
    from scheduler_worker.request import Request


class Drafter(Protocol):
    def propose(
        self, token_ids: list[int], state: object | None, k: int
    ) -> tuple[list[int], object]:
        """Up to k tokens likely to follow token_ids (all known: no placeholder), and the
        request's drafter state for the next call (`state`: the last call's, None at first)."""
        ...

    def observe(self, prompt_token_ids: list[int], output_token_ids: list[int]) -> None:
        """A request finished (or was aborted) with these tokens: a drafter that learns
        across requests keeps them."""
        ...


def propose(req: Request, drafter: Drafter | None, k: int) -> list[int]:
    """Up to k drafts for req: from its prediction (prediction.py) first, whatever the
    method; where that has none, from the server's drafter (its state kept on req)."""
    drafts = [] if req.prediction is None else req.prediction.propose(req.token_ids, k)
    if not drafts and drafter is not None:
        drafts, req.draft_state = drafter.propose(req.token_ids, req.draft_state, k)
    return drafts


def engine_drafter(
    config: EngineConfig, runner: ModelRunner, model_dir: Path, engine: Callable[..., Any]
) -> Drafter | None:
    """The engine's drafter: --speculative-method's, and the draft model's where one is
    given (draft_model.py: an `engine` (the LLMEngine class) of its own, loaded here)."""
    method, model = config.scheduler.speculative_method, config.scheduler.speculative_model
    cheap = make_drafter(method)
    if model is None:
        return cheap
    from scheduler_worker.spec.draft_model import ChainDrafter, DraftModelDrafter

    drafter = DraftModelDrafter.build(
        engine, config, runner.num_blocks, model_dir, runner.vocab_size
    )
    return drafter if cheap is None else ChainDrafter(cheap, drafter)


def make_drafter(method: str) -> Drafter | None:
    """The model-free drafter of --speculative-method; None: none (or the draft model's)."""
    if method in ("none", "draft"):
        return None
    if method == "ngram":
        return NgramDrafter()
    if method == "suffix":
        return SuffixDrafter()
    raise ConfigError(f"unknown speculative method {method!r}")
