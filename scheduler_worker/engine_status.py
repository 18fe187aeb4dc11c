"""What a scheduler replica says of itself in its EngineStatus beats (worker.py sends
them, every heartbeat_s and once after the engine goes idle): queue and KV figures, the
busy split, and its memory figures, whose measure is paced here.

The memory figures (memory_report: mincore over the CPU's KV pool and the heap's arenas,
/proc/self/maps; 1.9-3.1 ms) are measured at the first beat once idle, then at most every
heartbeat_s while idle, and every MEMORY_BUSY_S while the engine serves: a beat in the
middle of serving costs the steps a message, not milliseconds of page counting.
"""

from __future__ import annotations

import os
import time

from common.config import Config
from common.messages import EngineStatus
from scheduler_worker.engine import LLMEngine
from scheduler_worker.memory_report import memory_figures

MEMORY_BUSY_S = 10.0


def busy_split(engine: LLMEngine, ipc_time: float) -> dict[str, float]:
    """Cumulative seconds of the scheduler's busy time by part (ipc: the worker's)."""
    b = engine.counters.busy_time
    split = {
        "forward": b["forward"],
        "sample": b["sample"],
        "schedule": b["schedule"],
        "ipc": ipc_time,
    }
    clock = engine.runner.backend.clock
    if clock is not None:  # a GPU's own busy time and waits, beside the host's parts
        clock.collect()  # the forwards the device has passed since the last launch
        split["device"], split["device_wait"] = clock.busy_s, clock.wait_s
    return split


def placement_text(device: str, gpus: list[str]) -> str:
    """ "GPU 2 (NVIDIA H200)", or "cpu"."""
    return f"GPU {','.join(gpus)} ({device})" if gpus else device


class MemoryCadence:
    """The memory figures for a beat, measured or the last measure (module doc)."""

    def __init__(self, engine: LLMEngine, heartbeat_s: float) -> None:
        self.engine = engine
        self.heartbeat_s = heartbeat_s
        self.last: dict[str, float] = {}
        self.at = -MEMORY_BUSY_S  # monotonic: when `last` was measured
        self.idle = False  # ... with the engine idle

    def figures(self) -> dict[str, float]:
        now = time.monotonic()
        age, busy = now - self.at, self.engine.has_unfinished()
        if busy:
            keep_s = MEMORY_BUSY_S
        elif self.idle:
            keep_s = self.heartbeat_s  # requests that come one by one end in a beat each
        else:
            keep_s = 0.0  # the first idle beat after serving measures
        if age < keep_s:
            return self.last
        e = self.engine
        self.last = {**e.runner.backend.facts, **memory_figures(e.runner.kv_caches)}
        self.at, self.idle = now, not busy
        return self.last


def engine_status(
    kind: str,
    engine: LLMEngine,
    config: Config,
    busy: dict[str, float],
    memory: dict[str, float],
    inbox: str,
    proof: str | None,
    where: tuple[str, list[str]],
) -> EngineStatus:
    """The replica's EngineStatus of this kind ("ready", "heartbeat") now."""
    bm = engine.block_manager
    return EngineStatus(
        kind=kind,
        num_running=engine.num_running,
        num_waiting=engine.num_waiting,
        kv_usage=bm.usage,
        num_free_blocks=bm.num_free_blocks,
        num_total_blocks=bm.num_blocks,
        prefix_cache_queries=bm.prefix_cache_queries,
        prefix_cache_hits=bm.prefix_cache_hits,
        model=config.model_name,
        max_model_len=engine.max_model_len,
        vocab_size=engine.vocab_size,
        time=time.time(),
        busy=busy,
        replica=config.replica_id,
        pid=os.getpid(),
        inbox=inbox,
        proof=proof,
        weight_bytes=engine.runner.weight_memory.held_bytes,
        block_size=engine.scheduler.block_size,
        memory=memory,
        device=where[0],
        gpus=where[1],
        **spec_figures(engine),
    )


def spec_figures(engine: LLMEngine) -> dict:
    """EngineStatus.spec and .spec_method: {} and "" without speculative decoding."""
    method = engine.scheduler.config.speculative_method  # resolved: never "auto"
    if method == "none":
        return {}
    c = engine.counters
    spec = {
        "draft_tokens": c.draft_tokens,
        "accepted_tokens": c.accepted_tokens,
        "verify_steps": c.verify_steps,
        "switched_off_steps": engine.scheduler.policy.num_switched_off,
        "resolved_first_steps": engine.gate.tries,  # overlapped: the overlap given up
    }
    return {"spec": spec, "spec_method": method}
