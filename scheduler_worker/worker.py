"""The scheduler process: owns the engine and drives it from its ZeroMQ inbox.

    inbox (PULL, bind "scheduler") ◀── GenerateRequest (tokenizers), AbortRequest (frontend, detok)
    ──▶ PUSH "detok":    one StepOutputs per engine step, every request's new tokens
    ──▶ PUSH "frontend": EngineStatus (ready, heartbeat), RequestError (rejected requests)

Loop: block on the inbox only when idle; when busy, drain it without waiting, run one
step, push one message. An abort may arrive before its request (a tokenizer may still
hold it): such ids are remembered for a while and the request is dropped on arrival.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections import OrderedDict

import zmq

from common.config import Config
from common.log import get_logger
from common.messages import (
    AbortRequest,
    EngineStatus,
    GenerateRequest,
    RequestError,
    StepOutputs,
    pack_ids,
    unpack_ids,
)
from common.sampling_params import InvalidParameterError, SamplingParams
from common.zmq_queue import PullQueue, PushQueue, QueueFull
from scheduler_worker.engine import LLMEngine, RequestOutput, RequestRejectedError

log = get_logger("scheduler")

PRE_ABORT_TTL_S = 120.0
PRE_ABORT_MAX = 100_000


class SchedulerWorker:
    def __init__(self, config: Config, engine: LLMEngine | None = None) -> None:
        self.config = config
        self.engine = engine or LLMEngine(config.engine)
        self.ctx = zmq.Context.instance()
        self.inbox = PullQueue(config.ipc.endpoint("scheduler"), bind=True, ctx=self.ctx)
        self.to_detok = PushQueue(config.ipc.endpoint("detok"), bind=False, ctx=self.ctx)
        self.to_frontend = PushQueue(config.ipc.endpoint("frontend"), bind=False, ctx=self.ctx)
        self.pre_aborted: OrderedDict[str, float] = OrderedDict()
        self.detok_info: dict[str, tuple[str, list[str], bool, bool]] = {}
        self.step_no = 0
        self.running = True
        self.last_heartbeat = 0.0
        self.ipc_time = 0.0  # seconds spent encoding and sending outputs

    # ---- messages in --------------------------------------------------------
    def handle(self, msg) -> None:
        if isinstance(msg, GenerateRequest):
            self._add(msg)
        elif isinstance(msg, AbortRequest):
            if not self.engine.abort(msg.rid) and msg.rid not in self.detok_info:
                self._remember_abort(msg.rid)
        else:
            log.warning("dropping unexpected %s on the scheduler inbox", type(msg).__name__)

    def _add(self, msg: GenerateRequest) -> None:
        if self.pre_aborted.pop(msg.rid, None) is not None:
            return  # its client is gone already
        try:
            params = SamplingParams.from_dict(msg.params)
            self.engine.add_request(msg.rid, unpack_ids(msg.prompt_token_ids), params,
                                    arrival_time=None)
        except (InvalidParameterError, RequestRejectedError, ValueError) as e:
            self._send_error(msg.rid, str(e), getattr(e, "param", None))
            return
        self.detok_info[msg.rid] = (msg.rid, params.stop, params.skip_special_tokens,
                                    params.include_stop_str_in_output)

    def _remember_abort(self, rid: str) -> None:
        now = time.monotonic()
        self.pre_aborted[rid] = now
        while self.pre_aborted and (len(self.pre_aborted) > PRE_ABORT_MAX or
                                    next(iter(self.pre_aborted.values())) < now - PRE_ABORT_TTL_S):
            self.pre_aborted.popitem(last=False)

    def _send_error(self, rid: str, message: str, param: str | None) -> None:
        try:
            self.to_frontend.put(RequestError(rid, 400, message, "invalid_request_error", param))
        except QueueFull:
            log.error("frontend unreachable; dropped error for %s", rid)

    # ---- messages out -------------------------------------------------------
    def publish(self, outputs: list[RequestOutput]) -> None:
        if not outputs:
            return
        t0 = time.perf_counter()
        new_requests, logprobs, any_lp = [], [], False
        for o in outputs:
            info = self.detok_info.get(o.request_id)
            if info is not None and info[0] is not None:
                new_requests.append(info)
                self.detok_info[o.request_id] = (None, [], False, False)  # sent once
            if o.finish_reason is not None:
                self.detok_info.pop(o.request_id, None)
            if o.logprobs:
                any_lp = True
                logprobs.append([[lp.logprob, [[t, v] for t, v in zip(lp.top_ids, lp.top_logprobs)]]
                                 for lp in o.logprobs])
            else:
                logprobs.append(None)
        msg = StepOutputs(
            step=self.step_no,
            rids=[o.request_id for o in outputs],
            new_token_ids=[pack_ids(o.new_token_ids) for o in outputs],
            finish_reasons=[o.finish_reason for o in outputs],
            num_prompt_tokens=[o.num_prompt_tokens for o in outputs],
            num_output_tokens=[o.num_output_tokens for o in outputs],
            logprobs=logprobs if any_lp else None,
            new_requests=new_requests,
            timings=None,
            sent_time=time.time(),
        )
        try:
            self.to_detok.put(msg, timeout_ms=None)
        except QueueFull:
            log.error("detok queue full; step %d dropped", self.step_no)
        self.ipc_time += time.perf_counter() - t0

    def heartbeat(self, kind: str = "heartbeat") -> None:
        e = self.engine
        bm = e.block_manager
        with contextlib.suppress(QueueFull):
            self.to_frontend.put(EngineStatus(
                kind=kind, num_running=e.num_running, num_waiting=e.num_waiting,
                kv_usage=bm.usage, num_free_blocks=bm.num_free_blocks,
                num_total_blocks=bm.num_blocks, prefix_cache_queries=bm.prefix_cache_queries,
                prefix_cache_hits=bm.prefix_cache_hits, model=self.config.model_name,
                max_model_len=e.max_model_len, vocab_size=e.vocab_size, time=time.time(),
            ))
        self.last_heartbeat = time.monotonic()

    # ---- loop ---------------------------------------------------------------
    def run(self) -> None:
        log.info("engine ready: %d KV blocks of %d tokens, max_model_len %d",
                 self.engine.runner.num_blocks, self.engine.scheduler.block_size,
                 self.engine.max_model_len)
        self.heartbeat("ready")
        hb_ms = int(self.config.heartbeat_s * 1000)
        while self.running:
            if self.engine.has_unfinished():
                msgs = self.inbox.drain()
            else:
                msgs = self.inbox.get_batch(timeout_ms=hb_ms)
            for msg in msgs:
                self.handle(msg)
            if self.engine.has_unfinished():
                self.publish(self.engine.step())
                self.step_no += 1
            if time.monotonic() - self.last_heartbeat >= self.config.heartbeat_s:
                self.heartbeat()
        self.close()

    def stop(self, *_args) -> None:
        self.running = False

    def close(self) -> None:
        for q in (self.inbox, self.to_detok, self.to_frontend):
            q.close()


def run(config: Config) -> None:
    """Process entry: load the model, then serve until SIGTERM/SIGINT."""
    log.info("scheduler starting (pid %d), model %s", os.getpid(), config.engine.model.model)
    worker = SchedulerWorker(config)
    signal.signal(signal.SIGTERM, worker.stop)
    signal.signal(signal.SIGINT, worker.stop)
    worker.run()
