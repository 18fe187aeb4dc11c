"""One replica's tensor-parallel process group on torch.distributed, and its collectives.

    rendezvous   a TCPStore on rank 0: on a free port it picks itself (port 0, so no race
                 for it), handed to the ranks it spawns (parallel/ranks.py); or
                 torchrun's MASTER_ADDR / MASTER_PORT, RANK, WORLD_SIZE (a replica that
                 spans hosts: torchrun's agent hosts the store), or a LeaderWorkerSet
                 pod's LWS_* variables (rank 0's process hosts it, tcp://)
    backend      gloo on a CPU, NCCL on CUDA (each rank on its LOCAL_RANK's GPU of those
                 visible to the replica)
    timeout      every collective's (ModelConfig.collective_timeout_s): a rank that hangs
                 fails the others' collective after it, a rank that dies fails it at once
                 (its connections close); either way the step raises, and the replica
                 stops as a whole (worker.py)

gloo has no bfloat16 (or float16) all-reduce: such tensors are reduced in float32 and
cast back, which also makes the sum's rounding the float32 one.
"""

from __future__ import annotations

import datetime
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from common.log import get_logger
from scheduler_worker.backends.device import collective_backend, rank_device, reduce_dtype

log = get_logger("parallel")

# how long the ranks wait for each other to start (a large model loads for a while)
START_TIMEOUT = datetime.timedelta(seconds=600)


@dataclass
class Rendezvous:
    """Where the ranks of one replica meet and who this process is among them."""

    host: str
    port: int  # 0: rank 0 picks a free one (its store's port then says which)
    rank: int
    world: int
    local_rank: int = 0  # the GPU index among the replica's visible ones (NCCL)
    # the store at host:port is torchrun's agent's (env://); else rank 0 hosts it there
    # (a LeaderWorkerSet's pods: tcp://), or on a free port (`host_store`)
    agent_store: bool = True


class TPGroup:
    """The process group of one replica's ranks (the default group of this process).
    `host_store`: this is rank 0 starting its own followers, and hosts the store on a free
    port; else the store is torchrun's or rank 0's, found through the environment
    (init_method env://, as torchrun's ranks join)."""

    def __init__(self, rdv: Rendezvous, device: str, timeout_s: float, host_store: bool) -> None:
        self.rdv, self.rank, self.world = rdv, rdv.rank, rdv.world
        self.timeout = datetime.timedelta(seconds=timeout_s)
        self.backend = collective_backend(device)
        self.store: dist.TCPStore | None = None
        if host_store:
            self.store = dist.TCPStore(
                rdv.host,
                0,
                rdv.world,
                is_master=True,
                timeout=START_TIMEOUT,
                wait_for_workers=False,
            )
        self.port = self.store.port if self.store is not None else rdv.port
        self.device = rank_device(device, rdv.local_rank)
        self.started = False
        self.all_reduces = 0  # counted and timed: docs/benchmarks.md gives them a step
        self.reduce_s = 0.0  # in the model's collectives (all-reduces and the head's gather)

    def announce(self) -> None:
        """A follower: say in rank 0's store that this rank is joining (rank 0 waits for
        every rank so, watching the ones it started, before it joins the group itself)."""
        client = dist.TCPStore(self.rdv.host, self.rdv.port, is_master=False, timeout=START_TIMEOUT)
        client.set(f"joining/{self.rank}", "1")

    def start(self) -> None:
        """Join the group (blocks until every rank has joined)."""
        dist.init_process_group(
            self.backend,
            init_method=None if self.store is not None else self._init_method(),
            # env:// puts the group's keys under "default_pg/": the followers join so
            store=None if self.store is None else dist.PrefixStore("default_pg", self.store),
            rank=self.rank,
            world_size=self.world,
            timeout=self.timeout,
        )
        self.started = True
        log.info(
            "tensor-parallel rank %d of %d joined (%s, collectives time out after %.0f s)",
            self.rank,
            self.world,
            self.backend,
            self.timeout.total_seconds(),
        )

    def _init_method(self) -> str:
        """torchrun's agent store through its environment, else rank 0 hosts the store."""
        return "env://" if self.rdv.agent_store else f"tcp://{self.rdv.host}:{self.rdv.port}"

    def close(self) -> None:
        if self.started and dist.is_initialized():
            dist.destroy_process_group()
        self.started = False

    # ---- collectives ------------------------------------------------------------------
    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """The sum over the ranks of x (in place where it can)."""
        t0 = time.perf_counter()
        self.all_reduces += 1
        if reduce_dtype(self.backend, x.dtype) != x.dtype:  # gloo: no half-type sum
            wide = x.float()
            dist.all_reduce(wide)
            x = wide.to(x.dtype)
        else:
            dist.all_reduce(x)
        self.reduce_s += time.perf_counter() - t0
        return x

    def gather(self, x: torch.Tensor) -> list[torch.Tensor] | None:
        """Rank 0: every rank's x (same shape), in rank order; the other ranks: None."""
        t0 = time.perf_counter()
        wide = x.to(reduce_dtype(self.backend, x.dtype))
        wide = wide.contiguous()
        parts = [torch.empty_like(wide) for _ in range(self.world)] if self.rank == 0 else None
        dist.gather(wide, parts, dst=0)
        self.reduce_s += time.perf_counter() - t0
        return None if parts is None else [p.to(x.dtype) for p in parts]

    def gather_columns(self, x: torch.Tensor, width: int) -> torch.Tensor:
        """Rank 0: the ranks' x [rows, cols] side by side, cut to `width` columns; the
        other ranks get x back (only rank 0 samples)."""
        parts = self.gather(x)
        return x if parts is None else torch.cat(parts, dim=1)[:, :width]

    def broadcast(self, x: torch.Tensor) -> None:
        """x from rank 0 into every rank's x (same shape and dtype everywhere)."""
        dist.broadcast(x, 0)

    def min_int(self, value: int) -> int:
        """The least of every rank's value (the KV pool's blocks: the ranks agree)."""
        t = torch.tensor([value], dtype=torch.int64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MIN)
        return int(t.item())


_GROUP: TPGroup | None = None


def tp_group() -> TPGroup | None:
    """This process's tensor-parallel group; None with one rank (no tensor parallelism)."""
    return _GROUP


def set_tp_group(group: TPGroup | None) -> None:
    global _GROUP
    _GROUP = group
