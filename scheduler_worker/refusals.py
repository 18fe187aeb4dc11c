"""What a scheduler replica refuses before it serves, each a ConfigError naming the flag to
change: a second process claiming its inbox (checked before the model loads, so a
duplicate fails fast), and a KV pool that cannot hold one sequence of the context length.
"""

from __future__ import annotations

from common.config import Config, ConfigError
from common.endpoints import ipc_in_use
from scheduler_worker.engine import LLMEngine


def inbox_endpoint(config: Config) -> str:
    """Where this replica binds its inbox; ConfigError when another process holds it."""
    ep = config.ipc.replica_inbox or config.ipc.replica_endpoint(config.replica_id)
    if ipc_in_use(ep):
        raise ConfigError(
            f"replica {config.replica_id}: another process serves its inbox {ep}; "
            "refusing to start a second replica with that id"
        )
    return ep


def check_kv_pool(engine: LLMEngine) -> None:
    """Refuse to serve with a KV pool that cannot hold one sequence of the context length:
    every component validates requests against that length, so such a pool would fail
    requests the tokenizers had accepted."""
    bs, num_blocks = engine.scheduler.block_size, engine.runner.num_blocks
    pool = num_blocks * bs
    if pool < engine.max_model_len:
        raise ConfigError(
            f"the KV pool holds {pool} tokens ({num_blocks} blocks of {bs}), less than one "
            f"sequence of the context length ({engine.max_model_len} tokens): raise "
            f"--kv-cache-memory-gb or --num-kv-blocks, or set --max-model-len {pool} or less"
        )
