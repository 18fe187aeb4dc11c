"""The CUDA backend's eager kernels compiled at start, not on a request.

Triton compiles a kernel variant on its first launch (a cold cache: a second or more, every
stream stalled behind it). The graphs compile the decode kernel at their sizes' split counts
for the longest context, the mixed graphs and the profile step the prompt path; what an eager
step may still launch first is compiled here:

    a 17-token prompt step          the prompt path, where the profile step (skipped under
                                    --num-kv-blocks) and the mixed graphs (--enforce-eager)
                                    did not run
    a decode row at every split     an eager decode takes its cap of splits from its rows
    count (1, 2, 4, 16)             (the graphs' caps: their sizes'): kernel and merge, each
                                    cap its own variant

Every write goes to the scratch block (the slot padded graph rows write), never read.
"""

from __future__ import annotations

import time
from typing import Protocol

import torch

from common.log import get_logger
from scheduler_worker.attention import AttentionMetadata
from scheduler_worker.backends.base import KVCache, SeqInput, StepInputs

log = get_logger("cuda")


class WarmedBackend(Protocol):
    """What the warm-up reads of the CUDA backend (backends/cuda.py, which calls it)."""

    block_size: int
    scratch_block: int
    max_model_len: int
    device: torch.device

    def prepare(self, seqs: StepInputs) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]: ...


PROMPT_TOKENS = 17  # no multiple of 16: neither the profile's count nor a graph's


def warm_up(
    backend: WarmedBackend,
    model: torch.nn.Module,
    kv_caches: list[KVCache],
    split_choices: tuple[int, ...],
) -> float:
    """Run the steps above eagerly; returns the seconds they took."""
    t0 = time.perf_counter()
    bs, scratch = backend.block_size, backend.scratch_block
    # a long context (a few splits' keys), within the rope tables' positions
    context = min(max(split_choices) * 64, backend.max_model_len)
    steps: list[tuple[SeqInput, int | None]] = [
        (SeqInput([0] * PROMPT_TOKENS, 0, [scratch] * -(-PROMPT_TOKENS // bs)), None)
    ]
    decode = SeqInput([0], context - 1, [scratch] * -(-context // bs))
    steps += [(decode, splits) for splits in split_choices]
    with torch.inference_mode():
        for seq, splits in steps:
            ids, positions, meta = backend.prepare([seq])
            if splits is not None:
                meta.num_splits = splits
            model(ids, positions, kv_caches, meta)
    if backend.device.type == "cuda":
        torch.cuda.synchronize(backend.device)
    seconds = time.perf_counter() - t0
    log.info(
        "warm-up: a %d-token prompt step and decode at %s splits, eager, in %.2f s",
        PROMPT_TOKENS, "/".join(map(str, split_choices)), seconds,
    )  # fmt: skip
    return seconds
