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

A drafter that runs a model (a ModelDrafter: the draft model; an EAGLE head or MTP, a
file each) drafts for all of a step's rows at once: its propose() only reserves k drafts
(drafter.RESERVED ids, and the row's blocks for them), and once the scheduler has chosen the
step's rows, settle_drafts() has it fill every reserved row in one batch (fill). It keeps
per-row state of its own (the rows' draft KV), which drop_drafts() frees when a row stops
running (finished, aborted, preempted).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from common.config import ConfigError, EngineConfig
from scheduler_worker.spec.drafter import Drafter, ModelDrafter
from scheduler_worker.spec.ngram import NgramDrafter
from scheduler_worker.spec.suffix import SuffixDrafter

__all__ = [
    "Drafter",
    "ModelDrafter",
    "drop_drafts",
    "engine_drafter",
    "make_drafter",
    "propose",
    "settle_drafts",
]

if TYPE_CHECKING:
    from scheduler_worker.model_runner import ModelRunner
    from scheduler_worker.request import Request
    from scheduler_worker.scheduled_batch import ScheduledBatch
    from scheduler_worker.spec.policy import SpecPolicy


def settle_drafts(policy: SpecPolicy, drafter: Drafter | None, batch: ScheduledBatch) -> None:
    """After the step's decode rows drafted: drafts of rows preempted meanwhile go, the
    policy cuts what does not pay (SpecPolicy.settle), then a ModelDrafter fills the
    rows it reserved."""
    if not batch.drafts:
        return
    batch.drafts = {r: d for r, d in batch.drafts.items() if r in batch.entries}
    policy.settle(batch)
    if isinstance(drafter, ModelDrafter):
        drafter.fill(batch)


def drop_drafts(drafter: Drafter | None, req: Request) -> None:
    """req stops running (Scheduler._release): a ModelDrafter's state for it goes."""
    if isinstance(drafter, ModelDrafter):
        drafter.drop(req)


def propose(req: Request, drafter: Drafter | None, k: int, probing: bool = False) -> list[int]:
    """Up to k drafts for req: from its prediction (prediction.py) first, whatever the
    method; where that has none, from the server's drafter (its state kept on req). A
    probe (SpecPolicy.probing) asks a ModelDrafter only for a row it drafts for already:
    a row's first draft runs its whole prompt through the draft model (docs/benchmarks.md,
    "Speculation policy, seventh session"), else the cheaper drafter alone."""
    drafts = [] if req.prediction is None else req.prediction.propose(req.token_ids, k)
    if probing and isinstance(drafter, ModelDrafter) and not drafter.live(req):
        drafter = drafter.first
    if not drafts and drafter is not None:
        drafts, req.draft_state = drafter.propose(req.token_ids, req.draft_state, k)
    return drafts


def engine_drafter(
    config: EngineConfig, runner: ModelRunner, model_dir: Path, engine: Callable[..., Any]
) -> Drafter | None:
    """The engine's drafter: --speculative-method's, and the draft model's where one is
    given (draft_model.py: an `engine` (the LLMEngine class) of its own, loaded here)."""
    sched = config.scheduler.resolved(runner.backend.name)  # auto: by the device
    method, model = sched.speculative_method, sched.speculative_model
    cheap = make_drafter(method)
    if model is None:
        return cheap
    from scheduler_worker.spec.draft_model import DraftModelDrafter

    return DraftModelDrafter.build(engine, config, runner, model_dir, cheap)


def make_drafter(method: str) -> Drafter | None:
    """The model-free drafter of --speculative-method; None: none (or the draft model's)."""
    if method in ("none", "draft"):
        return None
    if method == "ngram":
        return NgramDrafter()
    if method == "suffix":
        return SuffixDrafter()
    raise ConfigError(f"unknown speculative method {method!r}")
