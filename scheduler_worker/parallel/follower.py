"""A follower rank (RANK 1 .. T-1): its shard of the model, run on rank 0's steps.

    loop: receive a step (parallel/step_channel.py) ─▶ the same ModelRunner call rank 0
          made (execute, or execute_with_prompt_logits), its result dropped ─▶ again
          until STOP, or until a collective fails (rank 0 gone or hung: the timeout)

No scheduler, sampler, tokenizer or socket: rank 0 owns those. SIGTERM / SIGINT do not end
the loop at once (rank 0 may be draining its requests, which needs this rank): rank 0's
STOP does; a watchdog ends the process if none comes within the drain's time.
"""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

from common.config import Config
from common.log import get_logger
from common.model_files.model_source import DEFAULT_MODEL_ALIAS, resolve_model
from scheduler_worker.parallel.group import Rendezvous, TPGroup, set_tp_group
from scheduler_worker.parallel.ranks import STOP_TIMEOUT_S, device_type, threads_per_rank
from scheduler_worker.parallel.step_channel import EXECUTE, NOOP, PROMPT_LOGITS, STOP, StepChannel

log = get_logger("parallel")


def _watchdog(seconds: float) -> None:
    """After a stop signal: exit if rank 0's STOP has not ended the loop in `seconds`."""
    timer = threading.Timer(seconds, lambda: os._exit(0))
    timer.daemon = True
    timer.start()


def _model_dir(config: Config) -> Path:
    """The model's directory as rank 0 resolves it, less the tokenizer check (rank 0 owns
    tokenization: a checkpoint directory without one serves the engine's tests)."""
    name = config.engine.model.model
    if name != DEFAULT_MODEL_ALIAS and Path(name).expanduser().is_dir():
        return Path(name).expanduser().absolute()
    return resolve_model(name, config.engine.model.resolved_cache_dir)


def serve(config: Config, rdv: Rendezvous) -> int:
    """Join rank 0's group, load this rank's shard, follow its steps; the exit code."""
    import torch

    from scheduler_worker.model_runner import ModelRunner

    config = threads_per_rank(config)
    model = config.engine.model
    if model.num_threads is not None:
        torch.set_num_threads(model.num_threads)
    grace = config.server.drain_timeout_s + STOP_TIMEOUT_S
    signalled: list[int] = []

    def on_signal(signum: int, _frame) -> None:
        if not signalled:
            log.info("rank %d: %s; stopping with rank 0", rdv.rank, signal.Signals(signum).name)
            _watchdog(grace)
        signalled.append(signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    group = TPGroup(rdv, device_type(config), model.collective_timeout_s, host_store=False)
    group.announce()
    group.start()
    set_tp_group(group)
    try:
        runner = ModelRunner(config.engine, _model_dir(config))
        channel = StepChannel(group)
        steps = 0
        while True:
            step = channel.receive()
            if step.kind == STOP:
                break
            if step.kind == NOOP:
                continue
            if step.kind == EXECUTE:
                assert step.seqs is not None
                runner.execute(step.seqs, step.argmax_vocab)
            elif step.kind == PROMPT_LOGITS:
                assert isinstance(step.seqs, list)
                runner.execute_with_prompt_logits(step.seqs, step.argmax_vocab)
            else:
                raise ValueError(f"unknown step kind {step.kind}")
            steps += 1
    except RuntimeError as e:  # a collective failed: rank 0 is gone or hung
        log.error("rank %d: the replica's group failed, stopping: %s", rdv.rank, e)
        return 1
    log.info("rank %d: stopped by rank 0 after %d steps", rdv.rank, steps)
    group.close()
    return 0
