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
from typing import Any

import zmq
from tokenizers import Tokenizer

from common.config import Config
from common.heartbeat import Heartbeat
from common.log import get_logger, install_stack_dump
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

STOPPED_MEMORY = 100_000
DRAIN_QUIET_S = 2.0  # on SIGTERM, stop once no step arrived for this long  # rids finished here by a stop string, to drop their late tokens


class DetokWorker:
    def __init__(self, config: Config, tokenizer: Tokenizer | None = None) -> None:
        self.config = config
        if tokenizer is None:
            model_dir = resolve_model(config.engine.model.model, config.engine.model.resolved_cache_dir)
            tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        self.tokenizer = tokenizer
        self.vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
        ctx: zmq.Context = zmq.Context.instance()
        self.inbox = PullQueue(config.ipc.endpoint("detok"), bind=True, ctx=ctx)
        self.to_frontend = PushQueue(config.ipc.endpoint("frontend"), bind=False, ctx=ctx)
        self.to_scheduler = PushQueue(config.ipc.endpoint("scheduler"), bind=False, ctx=ctx)
        self.requests: dict[str, RequestDetokenizer] = {}
        self.stopped: OrderedDict[str, None] = OrderedDict()
        self.detok_s: dict[str, float] = {}  # rid -> seconds spent detokenizing it so far
        self.running = True
        self.drain_deadline = 0.0
        self.quiet_since = 0.0  # when the last step arrived (or the stop signal, if later)
        self.last_heartbeat = 0.0

    def process(self, msg: StepOutputs) -> TextOutputs:
        n = len(msg.rids)
        parallel = (msg.new_token_ids, msg.finish_reasons, msg.num_prompt_tokens,
                    msg.num_output_tokens)
        if any(len(x) != n for x in parallel) or any(
                x is not None and len(x) != n for x in (msg.logprobs, msg.stop_token_ids)):
            log.warning("dropping step %d: StepOutputs lists of unequal lengths", msg.step)
            return TextOutputs([], [], [], [], [], [], None, None, [], time.time())
        if msg.timings is not None and len(msg.timings) != n:
            log.warning("step %d: timings of the wrong length ignored", msg.step)
        for rid, stop, skip_special, include_stop in msg.new_requests:
            self.requests[rid] = RequestDetokenizer(self.tokenizer, stop, skip_special, include_stop)
        out: dict[str, Any] = {k: [] for k in ("rids", "texts", "finish_reasons", "num_prompt_tokens",
                                                "num_output_tokens", "token_ids", "logprobs",
                                                "stop_reasons", "timings")}
        step_timings = msg.timings if msg.timings is not None and len(msg.timings) == n else None
        for i, rid in enumerate(msg.rids):
            t0 = time.perf_counter()
            if rid in self.stopped:
                continue  # finished here by a stop string; the scheduler is catching up
            det = self.requests.get(rid)
            if det is None:  # settings never seen (e.g. this process restarted): defaults
                det = self.requests[rid] = RequestDetokenizer(self.tokenizer)
            try:
                ids = new_ids = unpack_ids(msg.new_token_ids[i])
            except WireError as e:
                log.warning("dropping bad token ids for %s: %s", rid, e)
                continue
            stop_token = msg.stop_token_ids[i] if msg.stop_token_ids is not None else None
            if stop_token is not None and ids and ids[-1] == stop_token \
                    and not det.include_stop_str_in_output:  # fmt: skip
                ids = ids[:-1]  # as vLLM: the stop token's text is not output
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
            spent = self.detok_s.pop(rid, 0.0) if reason is not None else None
            if reason is not None:
                self.requests.pop(rid, None)
            else:
                self.detok_s[rid] = self.detok_s.get(rid, 0.0) + time.perf_counter() - t0
            timing = step_timings[i] if step_timings is not None else None
            if reason is not None:  # a stop-string finish has no scheduler stamps yet
                timing = dict(timing or {})
                timing["detok_time_s"] = (spent or 0.0) + time.perf_counter() - t0
                timing["detok_sent_time"] = time.time()
            out["timings"].append(timing)
            out["rids"].append(rid)
            out["texts"].append(text)
            out["finish_reasons"].append(reason)
            out["num_prompt_tokens"].append(msg.num_prompt_tokens[i])
            out["num_output_tokens"].append(msg.num_output_tokens[i])
            out["token_ids"].append(msg.new_token_ids[i])
            lps = msg.logprobs[i] if msg.logprobs else None
            out["logprobs"].append(self._name_tokens(new_ids, lps) if lps else lps)
            out["stop_reasons"].append(det.stop_str if det.stop_str is not None else stop_token)
        if not msg.logprobs:
            out["logprobs"] = None
        if all(t is None for t in out["timings"]):
            out["timings"] = None
        return TextOutputs(**out, sent_time=time.time())

    def _name_tokens(self, ids: list[int], lps: list) -> list:
        """Each per-token logprob entry [logprob, [[id, logprob], ...]] gets a third item:
        the decoded strings of the token and of its top ids, for the OpenAI response."""
        try:
            wanted = [[tid, *(t for t, _ in entry[1])] for tid, entry in zip(ids, lps)]
            flat = [t for row in wanted for t in row]
            if any(type(t) is not int or not 0 <= t < self.vocab_size for t in flat):
                return lps
            texts = iter(self.tokenizer.decode_batch([[t] for t in flat],
                                                     skip_special_tokens=False))  # fmt: skip
            return [[*entry[:2], [next(texts) for _ in row]] for entry, row in zip(lps, wanted)]
        except (TypeError, ValueError, IndexError):  # malformed: the frontend names ids
            return lps

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
        beacon = Heartbeat(self.config, "detok").start()  # beats even while busy
        hb = self.config.heartbeat_s
        while self.running or (time.monotonic() - self.quiet_since < DRAIN_QUIET_S
                               and time.monotonic() < self.drain_deadline):  # fmt: skip
            msgs = self.inbox.get_batch(timeout_ms=int(hb * 1000 if self.running else 100))
            if msgs:
                self.quiet_since = time.monotonic()
            for msg in msgs:
                if not isinstance(msg, StepOutputs):
                    log.warning("dropping unexpected %s on the detok inbox", type(msg).__name__)
                    continue
                try:
                    result = self.process(msg)
                except Exception:  # a bug must cost one step, never the worker
                    log.exception("detokenizing step %d failed; dropped", msg.step)
                    continue
                if result.rids:
                    try:
                        self.to_frontend.put(result, timeout_ms=None)
                    except QueueFull:
                        log.error("frontend queue full; dropped step %d", msg.step)
        beacon.stop()
        self.heartbeat("stopping")
        for q in (self.inbox, self.to_frontend, self.to_scheduler):
            q.close()

    def stop(self, *_args) -> None:
        """SIGTERM: keep detokenizing while the scheduler still sends steps (it drains too),
        until DRAIN_QUIET_S without any, or drain_timeout_s; a second signal stops now."""
        if not self.running:
            self.drain_deadline = 0.0
            return
        self.running = False
        self.drain_deadline = time.monotonic() + self.config.server.drain_timeout_s
        self.quiet_since = time.monotonic()  # the quiet period counts from the signal


def run(config: Config) -> None:
    install_stack_dump()
    worker = DetokWorker(config)
    signal.signal(signal.SIGTERM, worker.stop)
    signal.signal(signal.SIGINT, worker.stop)
    log.info("detok ready (pid %d)", os.getpid())
    worker.run()
