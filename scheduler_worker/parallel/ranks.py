"""A replica's ranks: rank 0 (this process) starts the others, joins them, stops them.

    rank 0 (the scheduler process: scheduler loop, sampling, every ZeroMQ socket)
      ├─ a TCPStore on a free port, the config written beside it (0600)
      ├─ python -m scheduler_worker --config F   × (T - 1), RANK=r WORLD_SIZE=T
      │    MASTER_ADDR/MASTER_PORT: the store; each dies with rank 0 (PR_SET_PDEATHSIG)
      └─ init_process_group once every rank is in the store (a rank that exits during
         the start fails it at once, naming the rank)

Under torchrun (WORLD_SIZE set) torchrun starts every rank and rank 0 starts none; a rank
whose RANK is not 0 runs the follower loop (parallel/follower.py) either way.

Stopping: rank 0 broadcasts STOP (the followers return from their loop and exit 0), waits
for them, and kills any still there after STOP_TIMEOUT_S. A rank that dies takes its
replica down: a follower's death fails rank 0's next collective (worker.py then ends the
process; launch.py restarts it with new followers), and rank 0's death takes its
followers (the parent-death signal, and their next collective fails too).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch

from common.config import Config, ConfigError
from common.endpoints import ensure_run_dir
from common.env import launched_rank
from common.log import get_logger
from common.process import die_with_parent
from scheduler_worker.backends.device import device_kind
from scheduler_worker.parallel.group import START_TIMEOUT, Rendezvous, TPGroup, set_tp_group
from scheduler_worker.parallel.step_channel import NOOP, STOP, StepChannel

log = get_logger("parallel")

STOP_TIMEOUT_S = 10.0
JOIN_POLL_S = 0.1


def rendezvous(config: Config) -> Rendezvous | None:
    """This process's place among its replica's ranks: torchrun's environment, else rank 0
    of tensor_parallel_size ranks it will start itself; None without tensor parallelism."""
    world = config.engine.model.tensor_parallel_size
    try:
        launched = launched_rank()
    except ValueError as e:
        raise ConfigError(str(e)) from None
    if launched is not None:
        rank, size, who = launched.rank, launched.world, launched.launcher
        if size != world:
            raise ConfigError(
                f"the group size {size} ({who}'s) and --tensor-parallel-size {world} disagree"
            )
        if world > 1 and rank >= size:
            raise ConfigError(f"rank {rank} is out of range for a group of {size} ({who}'s)")
        if world == 1:
            return None
        addr, port, local = launched.master_addr, launched.master_port, launched.local_rank
        return Rendezvous(addr, port, rank, size, local, launched.agent_store)
    return Rendezvous("127.0.0.1", 0, 0, world) if world > 1 else None


def threads_per_rank(config: Config) -> Config:
    """Each rank's torch threads: the config's, else this process's cores over the ranks."""
    model = config.engine.model
    if model.num_threads is not None or model.tensor_parallel_size == 1:
        return config
    threads = max(1, len(os.sched_getaffinity(0)) // model.tensor_parallel_size)
    return replace(config, engine=replace(config.engine, model=replace(model, num_threads=threads)))


class Ranks:
    """Rank 0's handle on its replica's other ranks (`procs`: those it started itself)."""

    def __init__(self, group: TPGroup) -> None:
        self.group = group
        self.procs: list[subprocess.Popen] = []
        self.config_file: Path | None = None  # the followers' copy, until they joined
        self.channel = StepChannel(group)

    def dead(self) -> str | None:
        """A line naming a follower this process started that has exited, else None."""
        for rank, p in enumerate(self.procs, start=1):
            if p.poll() is not None:
                return f"tensor-parallel rank {rank} (pid {p.pid}) exited with code {p.returncode}"
        return None

    def keepalive(self) -> None:
        """Rank 0 between steps (its beats): a follower that exited raises here, and the
        others' wait for a step (bounded by the group's timeout) starts again."""
        if (dead := self.dead()) is not None:
            raise RuntimeError(dead)
        self.channel.send(NOOP)

    def stop(self, graceful: bool = True) -> None:
        """STOP to the followers (graceful: the group is sound), then wait, then kill."""
        if graceful and self.group.started and self.dead() is None:
            try:
                self.channel.send(STOP)
            except RuntimeError as e:  # a follower went meanwhile: it is killed below
                log.warning("tensor-parallel STOP not delivered: %s", e)
        deadline = time.monotonic() + (STOP_TIMEOUT_S if graceful else 0.0)
        for p in self.procs:
            try:
                p.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        if graceful:
            self.group.close()
        set_tp_group(None)


def start_ranks(config: Config) -> Ranks | None:
    """Rank 0's start: the other ranks started (unless torchrun did), the group joined and
    set as this process's (parallel.group.tp_group). None without tensor parallelism."""
    rdv = rendezvous(config)
    if rdv is None:
        return None
    if rdv.rank != 0:
        raise ConfigError(f"RANK {rdv.rank}: only rank 0 runs the scheduler")
    config = threads_per_rank(config)
    if config.engine.model.num_threads is not None:
        torch.set_num_threads(config.engine.model.num_threads)
    own = launched_rank() is None  # else torchrun, or each LeaderWorkerSet pod, started it
    timeout = config.engine.model.collective_timeout_s
    group = TPGroup(rdv, device_type(config), timeout, host_store=own)
    ranks = Ranks(group)
    try:
        if own:
            _spawn_followers(ranks, config, rdv.world)
            _wait_joined(ranks, rdv.world)
        group.start()
    except BaseException:
        ranks.stop(graceful=False)
        raise
    set_tp_group(group)
    return ranks


def device_type(config: Config) -> str:
    """The ranks' device kind: the backend follows it (gloo on a CPU, NCCL on CUDA)."""
    return device_kind(config.engine.model.device)


def _spawn_followers(ranks: Ranks, config: Config, world: int) -> None:
    # an offline engine (no launch.py, no component start) may be the first to need the
    # run dir: create it here, private, as every component start does
    run_dir = ensure_run_dir(config.ipc.resolved_run_dir)
    fd, name = tempfile.mkstemp(prefix="tp-config-", suffix=".json", dir=run_dir)
    os.close(fd)
    ranks.config_file = Path(name)
    config.save(name)  # 0600: it may hold ipc.secret
    parent = os.getpid()
    for rank in range(1, world):
        env = {
            **os.environ,
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": str(world),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(ranks.group.port),
        }
        ranks.procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "scheduler_worker", "--config", name],
                stdin=subprocess.DEVNULL,
                env=env,
                preexec_fn=lambda: die_with_parent(parent),
            )
        )
        log.info("started tensor-parallel rank %d (pid %d)", rank, ranks.procs[-1].pid)


def _wait_joined(ranks: Ranks, world: int) -> None:
    """Until every rank has said it is joining (store key joining/r), failing at once when
    a rank this process started exits first."""
    keys = [f"joining/{r}" for r in range(1, world)]
    store = ranks.group.store
    assert store is not None  # this process hosts it
    deadline = time.monotonic() + START_TIMEOUT.total_seconds()
    try:
        while not store.check(keys):
            if (dead := ranks.dead()) is not None:
                raise RuntimeError(f"{dead} during the start")
            if time.monotonic() > deadline:
                raise RuntimeError(f"tensor-parallel ranks did not all start ({keys})")
            time.sleep(JOIN_POLL_S)
    finally:
        if ranks.config_file is not None:
            ranks.config_file.unlink(missing_ok=True)
