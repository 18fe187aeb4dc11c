"""scheduler_worker → frontend inbox: readiness and periodic engine statistics.

With data parallelism every replica sends its own, naming itself (`replica`, `pid`) and
the inbox it listens on; `proof` (common.auth.replica_proof) shows it holds the secret.
The frontend's replica table (frontend.cluster) is built from these."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from common.messages.base import Message


@dataclass(frozen=True, slots=True)
class EngineStatus(Message):
    TAG: ClassVar[int] = 5
    kind: str  # "ready" | "heartbeat"
    num_running: int
    num_waiting: int
    kv_usage: float  # used blocks / total blocks, in [0, 1]
    num_free_blocks: int
    num_total_blocks: int
    prefix_cache_queries: int  # cumulative, in tokens
    prefix_cache_hits: int  # cumulative, in tokens
    model: str
    max_model_len: int
    vocab_size: int
    time: float
    # cumulative seconds of scheduler busy time by part: forward, sample, schedule, ipc
    busy: dict[str, float] = field(default_factory=dict)
    replica: int = 0
    pid: int = 0
    inbox: str | None = None  # None: the config's address (IPCConfig.replica_endpoint)
    proof: str | None = None
    weight_bytes: int = 0  # the model's weights held by the replica (scheduler_worker.loader)
    block_size: int = 0  # tokens per KV block (the routing key's length); 0: not stated
    # a GPU replica's memory plan, bytes (backends/cuda.py): gpu_total, weights,
    # activation_peak, kv_pool, graphs; utilization (the flag) and graph_capture_seconds
    memory: dict[str, float] = field(default_factory=dict)
    # where it runs: "cpu", or its GPU's name ("NVIDIA H200"); a GPU replica's GPU ids as
    # its launcher named them (CUDA_VISIBLE_DEVICES entries, common/gpus.py), [] on a CPU
    device: str = ""
    gpus: list[str] = field(default_factory=list)
    # speculative decoding, cumulative: draft_tokens, accepted_tokens, verify_steps (steps
    # with drafts), switched_off_steps (spec/policy.py: drafts that would not pay),
    # resolved_first_steps (spec/overlap.py: the step in flight resolved to draft); its method
    spec: dict[str, float] = field(default_factory=dict)
    spec_method: str = ""
