"""The scheduler process: owns the engine and drives it from its ZeroMQ inbox.

    inbox (PULL, bind "scheduler.K") ◀── GenerateRequest (tokenizers), AbortRequest (frontend, detok)
    ──▶ PUSH "detok":    one StepOutputs per engine step, every request's new tokens
    ──▶ PUSH "frontend.I": RequestError (rejected requests) to the frontend that accepted
                           it; EngineStatus (ready, heartbeat) to every frontend

Loop: block on the inbox only when idle; when busy, drain it without waiting, run one
step, push one message. An abort may arrive before its request (a tokenizer may still
hold it): such ids are remembered for a while and the request is dropped on arrival.
Beside the engine's own state, the worker keeps one RequestRecord per request, from its
GenerateRequest until its finishing output has gone out.

Data parallelism: each of N replicas (`--replica-id K`) is this process, with its own
engine, KV pool and inbox (IPCConfig.replica_endpoint(K), or --replica-inbox); it names
itself and that inbox in its EngineStatus (the frontend's replica table) and in every
StepOutputs (the detok sends a stop-string abort back to it). A second process claiming
a replica's ipc inbox, or its tcp port, is refused before it loads the model.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections import OrderedDict
from dataclasses import dataclass

import zmq

from common.auth import passed_intake, replica_proof, verify_rid
from common.config import Config, ConfigError
from common.endpoints import advertised
from common.log import get_logger, install_stack_dump
from common.messages import (
    AbortRequest,
    ComponentStatus,
    GenerateRequest,
    NewRequest,
    RequestError,
    WireError,
    unpack_ids,
)
from common.worker_shell import DRAIN_POLL_MS, WorkerShell, on_stop_signals
from common.zmq_queue import PullQueue, PushQueue, QueueFull
from scheduler_worker.engine import LLMEngine
from scheduler_worker.engine_status import (
    MemoryCadence,
    busy_split,
    engine_status,
    placement_text,
)
from scheduler_worker.heap import release_freed_heap
from scheduler_worker.parallel.ranks import Ranks, rendezvous, start_ranks
from scheduler_worker.refusals import check_kv_pool, inbox_endpoint
from scheduler_worker.step_message import step_message
from scheduler_worker.step_output import OutputColumns
from scheduler_worker.structured import masks_overlap

log = get_logger("scheduler")

PRE_ABORT_TTL_S = 120.0
PRE_ABORT_MAX = 100_000
# on SIGTERM, once idle, stop after this long without a new request (see stop())
DRAIN_QUIET_S = 1.0
# a beat this long after the engine goes idle, if nothing arrived meanwhile (run())
IDLE_BEAT_MS = 20


@dataclass(slots=True)
class RequestRecord:
    """What the worker knows of a request that the engine does not."""

    origin: int  # pid of the frontend that accepted it (a restarted one's are aborted)
    frontend: int  # that frontend's id: where its errors go
    tokenized_time: float  # wall clock: a tokenizer worker passed it on
    detok_settings: NewRequest  # for StepOutputs.new_requests (rid, stop, flags)
    announced: bool = False  # detok_settings went out, with the first output


class SchedulerWorker:
    def __init__(
        self, config: Config, engine: LLMEngine | None = None, ranks: Ranks | None = None
    ) -> None:
        self.config = config
        self.ranks = ranks  # tensor parallelism: the replica's other ranks (rank 0's handle)
        self.replica = config.replica_id
        self.component = f"scheduler.{self.replica}"  # its ComponentStatus name
        bind = inbox_endpoint(config)  # before the model loads: a duplicate fails fast
        self.engine = engine or LLMEngine(config.engine)
        release_freed_heap()  # the load's peak (the head's repacking), given back (heap.py)
        check_kv_pool(self.engine)
        # before "ready": the build holds the GIL for seconds on a large vocabulary, which
        # while serving would silence the heartbeat thread (GrammarMatchers)
        self.engine.grammars.wait_tokenizer()
        release_freed_heap()  # and the tokenizer build's
        # replicas share the cores: on a CPU a mask thread overlaps the forward only on a
        # spare one (on a GPU always: structured.masks_overlap)
        device_runs = self.engine.runner.backend.overlap
        self.engine.grammars.overlap = masks_overlap(device_runs, config.data_parallel_size)
        self.ctx: zmq.Context = zmq.Context.instance()
        try:
            self.inbox = PullQueue(bind, bind=True, ctx=self.ctx)
        except zmq.ZMQError as e:  # a tcp port held by another process (another replica)
            raise ConfigError(f"replica {self.replica}: cannot bind {bind}: {e}") from None
        self.inbox_ep = config.ipc.replica_advertise or advertised(bind)
        self.proof = replica_proof(config.ipc.secret, self.replica, os.getpid())
        # liveness from a thread (a long prefill is not a death); on SIGTERM, drain: see stop()
        self.shell = WorkerShell(
            config, self.component, self.inbox, self.heartbeat, beacon=True, quiet_s=DRAIN_QUIET_S
        )
        self.drain = self.shell.drain  # touched by requests and aborts only, not by beats
        self.to_frontend = self.shell.to_frontend
        self.to_detok = self.shell.own(PushQueue(config.ipc.endpoint("detok"), bind=False))
        self.pre_aborted: OrderedDict[str, float] = OrderedDict()
        self.frontend_pids: dict[str, int] = {}  # "frontend.I" -> its pid, from its beats
        self.requests: dict[str, RequestRecord] = {}  # until the finishing output is sent
        self.unannounced: set[str] = set()  # requests whose first output is still to go
        self.step_no = 0
        self.ipc_time = 0.0  # seconds spent encoding and sending outputs
        self.memory = MemoryCadence(self.engine, config.heartbeat_s)  # for the beats
        # its device and GPUs, named (every rank's)
        tp = config.engine.model.tensor_parallel_size
        self.where = self.engine.runner.backend.placement(tp)

    # ---- messages in --------------------------------------------------------
    def handle(self, msg) -> None:
        """One inbox message into the engine: a request to admit (or refuse with a
        RequestError), an abort, a frontend's heartbeat (a new pid: the old one's
        requests are orphans). What comes out of the engine goes in one StepOutputs
        per step (publish)."""
        if isinstance(msg, (GenerateRequest, AbortRequest)):
            self.drain.touch()
        if isinstance(msg, GenerateRequest):
            self._add(msg)
        elif isinstance(msg, AbortRequest):
            if not self.engine.abort(msg.rid) and msg.rid not in self.requests:
                self._remember_abort(msg.rid)
        elif isinstance(msg, ComponentStatus) and msg.component.startswith("frontend"):
            self._on_frontend(msg.component, msg.pid)
        else:
            log.warning("dropping unexpected %s on the scheduler inbox", type(msg).__name__)

    def _on_frontend(self, component: str, pid: int) -> None:
        """A new pid for a frontend (by its id, "frontend.I"): the old process died, and
        nobody waits for its requests; the other frontends' requests run on."""
        old = self.frontend_pids.get(component)
        self.frontend_pids[component] = pid
        if old is not None and old != pid:
            # only the old process's requests: the new one may have sent some already
            rids = [rid for rid, rec in self.requests.items() if rec.origin == old]
            num = sum(1 for rid in rids if self.engine.abort(rid))  # not those finished already
            if num:
                log.warning(
                    "%s restarted (pid %d -> %d): aborted its %d request(s)",
                    component,
                    old,
                    pid,
                    num,
                )

    def _add(self, msg: GenerateRequest) -> None:
        if not verify_rid(self.config.ipc.secret, msg.rid):
            log.warning(
                "dropping a GenerateRequest the frontend did not sign (id %r)", msg.rid[:80]
            )
            return
        if self.pre_aborted.pop(msg.rid, None) is not None:
            return  # its client is gone already
        if msg.rid in self.requests:  # only a forged or replayed frame can do this
            log.warning("dropping a second request with the running id %s", msg.rid)
            return
        try:
            params = msg.params  # typed on the wire (common.sampling_params)
            # a signed id: the frontend validated it, the tokenizer checked its limits
            checked = passed_intake(self.config.ipc.secret, msg.rid)
            pred = msg.prediction_token_ids
            self.engine.add_request(
                msg.rid,
                unpack_ids(msg.prompt_token_ids),
                params,
                checked=checked,
                prediction=None if pred is None else unpack_ids(pred),
            )
        except ValueError as e:  # InvalidParameterError, RequestRejectedError, a duplicate id
            self._send_error(msg.rid, msg.frontend, str(e), getattr(e, "param", None))
            return
        detok = (
            msg.rid,
            params.stop,
            params.skip_special_tokens,
            params.include_stop_str_in_output,
            msg.frontend,
            params.min_tokens,
        )
        self.requests[msg.rid] = RequestRecord(msg.origin, msg.frontend, msg.tokenized_time, detok)
        self.unannounced.add(msg.rid)

    def _remember_abort(self, rid: str) -> None:
        now = time.monotonic()
        self.pre_aborted[rid] = now
        while self.pre_aborted and (
            len(self.pre_aborted) > PRE_ABORT_MAX
            or next(iter(self.pre_aborted.values())) < now - PRE_ABORT_TTL_S
        ):
            self.pre_aborted.popitem(last=False)

    def _send_error(
        self, rid: str, frontend: int, message: str, param: str | None, status: int = 400
    ) -> None:
        kind = "invalid_request_error" if status < 500 else "server_error"
        try:
            self.to_frontend.put(RequestError(rid, status, message, kind, param), frontend)
        except QueueFull:
            log.error("frontend unreachable; dropped error for %s", rid)

    # ---- messages out -------------------------------------------------------
    def publish(self, outputs: OutputColumns) -> None:
        if not outputs:
            return
        t0 = time.perf_counter()
        bm = self.engine.block_manager
        msg = step_message(
            self.step_no,
            outputs,
            self.requests,
            self.unannounced,
            replica=self.replica,
            inbox=self.inbox_ep,
            prefix_cache=[bm.prefix_cache_queries, bm.prefix_cache_hits],
        )
        try:
            self.to_detok.put(msg, timeout_ms=None)
        except QueueFull:
            log.error("detok queue full; step %d dropped", self.step_no)
        except WireError as e:  # a bug, not the client's: say so loudly, keep serving
            log.error("step %d could not be encoded, dropped: %s", self.step_no, e)
        self.ipc_time += time.perf_counter() - t0

    def busy_split(self) -> dict[str, float]:
        """Cumulative seconds of the scheduler's busy time by part."""
        return busy_split(self.engine, self.ipc_time)

    def heartbeat(self, kind: str = "heartbeat") -> None:
        """EngineStatus: readiness, then queue/KV figures between steps. Liveness itself is
        the Heartbeat thread's job, so a long step is not mistaken for a death."""
        # the pid tells the frontends about restarts
        self.to_frontend.broadcast(ComponentStatus(self.component, os.getpid(), kind, time.time()))
        busy, memory = self.busy_split(), self.memory.figures()
        status = engine_status(
            kind, self.engine, self.config, busy, memory, self.inbox_ep, self.proof, self.where
        )
        self.to_frontend.broadcast(status)

    # ---- loop ---------------------------------------------------------------
    def run(self) -> None:
        log.info(
            "replica %d engine ready at %s on %s: %d KV blocks of %d tokens, max_model_len %d",
            self.replica,
            self.inbox_ep,
            placement_text(*self.where),
            self.engine.runner.num_blocks,
            self.engine.scheduler.block_size,
            self.engine.max_model_len,
        )
        shell, drain = self.shell, self.drain
        shell.start()  # "ready", and the heartbeat thread
        beat_s = self.config.heartbeat_s
        beat_ms = int(beat_s * 1000)
        unsaid_idle = False  # the engine went idle since the last beat
        while drain.running or drain.draining(busy=self.engine.has_unfinished()):
            t0 = time.perf_counter()
            if self.engine.has_unfinished():
                msgs = self.inbox.drain()
            else:
                wait_ms = beat_ms if drain.running else DRAIN_POLL_MS
                msgs = self.inbox.get_batch(
                    timeout_ms=min(wait_ms, IDLE_BEAT_MS) if unsaid_idle else wait_ms
                )
                t0 = time.perf_counter()  # waiting idle is not busy time
            for msg in msgs:
                try:
                    self.handle(msg)
                except Exception:  # a bad message costs itself, never the engine loop
                    log.exception("dropping %s that failed", type(msg).__name__)
            self.ipc_time += time.perf_counter() - t0  # receiving, decoding, admitting
            stepped = self.engine.has_unfinished()
            if stepped:
                self.publish(self.engine.step_rows())
                self.step_no += 1
                for rid, message, status in self.engine.take_failed():
                    rec = self.requests.pop(rid, None)
                    self.unannounced.discard(rid)
                    frontend = 0 if rec is None else rec.frontend
                    self._send_error(rid, frontend, message, None, status)
            # every heartbeat_s, and once the engine has been idle IDLE_BEAT_MS with
            # nothing arriving: the frontends' figures (busy split, running, KV) are then
            # those of the finished run, not of a beat up to heartbeat_s before its end,
            # and a request that follows at once is not kept waiting by the beat
            # (a pass that steps runs the whole of a run whose request arrived in it, when
            # the step is not overlapped: a 1-token request, a prompt scored)
            unsaid_idle = unsaid_idle or (stepped and not self.engine.has_unfinished())
            quiet = unsaid_idle and not stepped and not msgs  # a whole IDLE_BEAT_MS wait
            if quiet or time.monotonic() - shell.last_beat >= beat_s:
                shell.beat()
                unsaid_idle = False
                if self.ranks is not None:  # the followers wait on the group: keep it live
                    self.ranks.keepalive()
        shell.finish(self._last_word)

    def _last_word(self) -> None:
        """Say "stopping" through the detok, behind this process's last outputs: the
        frontend fails what is still open only once everything sent before has reached it."""
        with contextlib.suppress(QueueFull):
            self.to_detok.put(ComponentStatus(self.component, os.getpid(), "stopping", time.time()))

    def stop(self, *_args) -> None:
        """SIGTERM: finish the requests running, and those still on their way through the
        tokenizers, for up to drain_timeout_s. The frontend is the gate that refuses new
        work (503 while it drains); supervisord stops every program at the same moment, so
        what the frontend accepted just before may reach this inbox after the signal."""
        if self.drain.stop() and self.engine.has_unfinished():  # False: a second signal
            log.info(
                "draining %d request(s) for at most %.0f s",
                self.engine.num_unfinished,
                self.config.server.drain_timeout_s,
            )

    def close(self) -> None:
        self.shell.close()


def run(config: Config) -> None:
    """Process entry: load the model, then serve until SIGTERM/SIGINT. Under tensor
    parallelism this is rank 0 (it starts the other ranks) or, with a RANK other than 0,
    a follower (scheduler_worker/parallel/)."""
    install_stack_dump()
    try:
        rdv = rendezvous(config)
    except ConfigError as e:
        log.error("%s", e)
        sys.exit(2)
    if rdv is not None and rdv.rank != 0:
        from scheduler_worker.parallel.follower import serve

        sys.exit(serve(config, rdv))
    log.info(
        "scheduler replica %d starting (pid %d), model %s",
        config.replica_id,
        os.getpid(),
        config.engine.model.model,
    )
    if config.engine.model.num_threads is not None:
        import torch

        torch.set_num_threads(config.engine.model.num_threads)
    ranks: Ranks | None = None
    try:
        ranks = start_ranks(config)
        worker = SchedulerWorker(config, ranks=ranks)
    except ConfigError as e:
        log.error("%s", e)
        if ranks is not None:
            ranks.stop(graceful=False)
        sys.exit(2)
    on_stop_signals(worker.stop)
    if ranks is None:
        worker.run()
        return
    try:
        worker.run()
    except RuntimeError as e:  # a collective failed: a rank died or hung
        log.error(
            "replica %d stops: its tensor-parallel group failed (%s): %s",
            config.replica_id,
            ranks.dead() or "a rank hung or its connection broke",
            str(e).splitlines()[0][:300] if str(e) else type(e).__name__,
        )
        ranks.stop(graceful=False)
        worker.shell.finish(worker._last_word)  # what is in flight fails now
        sys.exit(1)
    ranks.stop()
