"""The offline loop on top of the engine's step API (LLMEngine.generate)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, Protocol

from common.sampling_params import SamplingParams


class LLMEngine(Protocol):
    """What the loop reads of scheduler_worker.engine.LLMEngine (no import: that imports this)."""

    def add_request(self, request_id: str, prompt: Any, params: SamplingParams) -> Any: ...
    def has_unfinished(self) -> bool: ...
    def step(self) -> list[Any]: ...


def run_to_end(
    engine: LLMEngine,
    prompts: Sequence[Sequence[int]],
    params: SamplingParams | Sequence[SamplingParams] | None = None,
) -> list[list[int]]:
    """Run prompts (token ids) to completion; returns each one's generated token ids."""
    params = params if params is not None else SamplingParams()
    plist = list(params) if not isinstance(params, SamplingParams) else [params] * len(prompts)
    base = f"gen-{time.monotonic_ns()}-"
    for i, (prompt, p) in enumerate(zip(prompts, plist)):
        engine.add_request(f"{base}{i}", prompt, p)
    results: dict[str, list[int]] = {f"{base}{i}": [] for i in range(len(prompts))}
    while engine.has_unfinished():
        for out in engine.step():
            if out.request_id in results:
                results[out.request_id].extend(out.new_token_ids)
    return [results[f"{base}{i}"] for i in range(len(prompts))]
