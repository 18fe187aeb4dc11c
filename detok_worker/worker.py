"""The detokenizer process: token ids in, text deltas out, one message per engine step.

    inbox (PULL, bind "detok") ◀── StepOutputs (scheduler)
    ──▶ PUSH "frontend":  TextOutputs (one per StepOutputs), ComponentStatus
    ──▶ PUSH "scheduler": AbortRequest when a stop string ends a request

A request's detokenizer settings arrive once, in the first StepOutputs naming it. A stop
string hit finishes the request here at once (finish_reason "stop"); the tokens the
scheduler produced before it learned of the abort are dropped.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections import OrderedDict

import zmq
from tokenizers import Tokenizer

from common.config import Config
from common.log import get_logger
from common.messages import (
    AbortRequest,
    ComponentStatus,
    StepOutputs,
    TextOutputs,
    WireError,
    unpack_ids,
)
from common.model_source import resolve_model
from common.zmq_queue import PullQueue, PushQueue, QueueFull
from detok_worker.incremental import RequestDetokenizer

log = get_logger("detok")

STOPPED_MEMORY = 100_000  # rids finished here by a stop string, to drop their late tokens


class DetokWorker:
    def __init__(self, config: Config, tokenizer: Tokenizer | None = None) -> None:
        self.config = config
        if tokenizer is None:
            model_dir = resolve_model(config.engine.model.model, config.engine.model.resolved_cache_dir)
            tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        self.tokenizer = tokenizer
        ctx = zmq.Context.instance()
        self.inbox = PullQueue(config.ipc.endpoint("detok"), bind=True, ctx=ctx)
        self.to_frontend = PushQueue(config.ipc.endpoint("frontend"), bind=False, ctx=ctx)
        self.to_scheduler = PushQueue(config.ipc.endpoint("scheduler"), bind=False, ctx=ctx)
        self.requests: dict[str, RequestDetokenizer] = {}
        self.stopped: OrderedDict[str, None] = OrderedDict()
        self.running = True
        self.last_heartbeat = 0.0

    def process(self, msg: StepOutputs) -> TextOutputs:
        for rid, stop, skip_special, include_stop in msg.new_requests:
            self.requests[rid] = RequestDetokenizer(self.tokenizer, stop, skip_special, include_stop)
        out: dict[str, list] = {k: [] for k in ("rids", "texts", "finish_reasons", "num_prompt_tokens",
                                                "num_output_tokens", "token_ids", "logprobs",
                                                "stop_reasons")}
        for i, rid in enumerate(msg.rids):
            if rid in self.stopped:
                continue  # finished here by a stop string; the scheduler is catching up
            det = self.requests.get(rid)
            if det is None:  # settings never seen (e.g. this process restarted): defaults
                det = self.requests[rid] = RequestDetokenizer(self.tokenizer)
            try:
                ids = unpack_ids(msg.new_token_ids[i])
            except WireError as e:
                log.warning("dropping bad token ids for %s: %s", rid, e)
                continue
            text, stop_hit = det.add_tokens(ids)
            reason = msg.finish_reasons[i]
            if stop_hit:
                reason = "stop"
                self._remember_stopped(rid)
                if msg.finish_reasons[i] is None:
                    with contextlib.suppress(QueueFull):
                        self.to_scheduler.put(AbortRequest(rid, "stop_string"))
            elif reason is not None:
                text += det.finish()
                if det.stopped:
                    reason = "stop"
            if reason is not None:
                self.requests.pop(rid, None)
            out["rids"].append(rid)
            out["texts"].append(text)
            out["finish_reasons"].append(reason)
            out["num_prompt_tokens"].append(msg.num_prompt_tokens[i])
            out["num_output_tokens"].append(msg.num_output_tokens[i])
            out["token_ids"].append(msg.new_token_ids[i])
            out["logprobs"].append(msg.logprobs[i] if msg.logprobs else None)
            out["stop_reasons"].append(det.stop_str)
        if not msg.logprobs:
            out["logprobs"] = None
        return TextOutputs(**out, timings=None, sent_time=time.time())

    def _remember_stopped(self, rid: str) -> None:
        self.stopped[rid] = None
        while len(self.stopped) > STOPPED_MEMORY:
            self.stopped.popitem(last=False)

    def heartbeat(self, kind: str = "heartbeat") -> None:
        with contextlib.suppress(QueueFull):
            self.to_frontend.put(ComponentStatus("detok", os.getpid(), kind, time.time()))
        self.last_heartbeat = time.monotonic()

    def run(self) -> None:
        self.heartbeat("ready")
        hb = self.config.heartbeat_s
        while self.running:
            for msg in self.inbox.get_batch(timeout_ms=int(hb * 1000)):
                if not isinstance(msg, StepOutputs):
                    log.warning("dropping unexpected %s on the detok inbox", type(msg).__name__)
                    continue
                result = self.process(msg)
                if result.rids:
                    try:
                        self.to_frontend.put(result, timeout_ms=None)
                    except QueueFull:
                        log.error("frontend queue full; dropped step %d", msg.step)
            if time.monotonic() - self.last_heartbeat >= hb:
                self.heartbeat()
        self.heartbeat("stopping")
        for q in (self.inbox, self.to_frontend, self.to_scheduler):
            q.close()

    def stop(self, *_args) -> None:
        self.running = False


def run(config: Config) -> None:
    worker = DetokWorker(config)
    signal.signal(signal.SIGTERM, worker.stop)
    signal.signal(signal.SIGINT, worker.stop)
    log.info("detok ready (pid %d)", os.getpid())
    worker.run()
