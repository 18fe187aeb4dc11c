"""The detokenizer process: token ids in, text deltas out, one message per engine step.

    inbox (PULL, bind "detok") ◀── StepOutputs (every scheduler replica)
    ──▶ PUSH "frontend":  TextOutputs (one per StepOutputs), ComponentStatus
    ──▶ PUSH "scheduler.K": AbortRequest when a stop string ends a request, to the
                            replica that sent the step (StepOutputs.replica / inbox)

One detok serves every replica: it costs far less per token than a replica's engine
step (docs/architecture.md, "Data parallelism"), and a rid belongs to one replica only.

A request's detokenizer settings arrive once, in the first StepOutputs naming it. A stop
string hit finishes the request here at once (finish_reason "stop"); the tokens the
scheduler produced before it learned of the abort are dropped.

Stream interval (server.stream_interval = N, vLLM's --stream-interval): a request's first
token goes out at once (TTFT is unchanged), then its text goes out once N more tokens
have come since the last send, and always with the finish (a stop string hit included).
What is held meanwhile (text, token ids, logprobs) is merged into the next send, so the
frontend sees the same text and tokens in fewer, larger deltas.
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
from common.heartbeat import Heartbeat
from common.log import get_logger, install_stack_dump
from common.messages import (
    AbortRequest,
    ComponentStatus,
    StepOutput,
    StepOutputs,
    TextOutput,
    TextOutputs,
    WireError,
    pack_text_outputs,
    unpack_ids,
    unpack_step_outputs,
)
from common.model_source import resolve_model
from common.zmq_queue import PullQueue, PushQueue, QueueFull
from detok_worker.incremental import RequestDetokenizer

log = get_logger("detok")

STOPPED_MEMORY = 100_000  # rids finished here by a stop string, to drop their late tokens
DRAIN_QUIET_S = 2.0  # on SIGTERM, stop once no step arrived for this long


class DetokWorker:
    def __init__(self, config: Config, tokenizer: Tokenizer | None = None) -> None:
        self.config = config
        if tokenizer is None:
            model_dir = resolve_model(
                config.engine.model.model, config.engine.model.resolved_cache_dir
            )
            tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        self.tokenizer = tokenizer
        self.vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
        ctx: zmq.Context = zmq.Context.instance()
        self.inbox = PullQueue(config.ipc.endpoint("detok"), bind=True, ctx=ctx)
        self.to_frontend = PushQueue(config.ipc.endpoint("frontend"), bind=False, ctx=ctx)
        self._ctx = ctx
        self._to_replicas: dict[str, PushQueue] = {}  # inbox endpoint -> a socket to it
        self.requests: dict[str, RequestDetokenizer] = {}
        self.stopped: OrderedDict[str, None] = OrderedDict()
        self.detok_s: dict[str, float] = {}  # rid -> seconds spent detokenizing it so far
        self.stream_interval = config.server.stream_interval
        self.held: dict[str, TextOutput] = {}  # rid -> output not sent yet (stream interval)
        self.sent_at: dict[str, int] = {}  # rid -> its num_output_tokens when last sent
        self.running = True
        self.drain_deadline = 0.0
        self.quiet_since = 0.0  # when the last step arrived (or the stop signal, if later)
        self.last_heartbeat = 0.0

    def process(self, msg: StepOutputs) -> TextOutputs:
        try:
            outputs = unpack_step_outputs(msg)
        except WireError as e:
            log.warning("dropping step %d: %s", msg.step, e)
            return pack_text_outputs([])
        for rid, stop, skip_special, include_stop in msg.new_requests:
            self.requests[rid] = RequestDetokenizer(
                self.tokenizer, stop, skip_special, include_stop
            )
        inbox = msg.inbox or self.config.ipc.replica_endpoint(msg.replica)
        texts = (self._detokenize(o, inbox) for o in outputs)
        if self.stream_interval > 1:
            texts = (self._coalesce(t) for t in texts if t is not None)
        kept = [t for t in texts if t is not None]
        return pack_text_outputs(kept, msg.replica, msg.prefix_cache)

    def _coalesce(self, out: TextOutput) -> TextOutput | None:
        """Stream interval: out merged with what was held for its request, or None while
        it is held (first token: sent; then every stream_interval tokens; the finish)."""
        rid = out.rid
        prev = self.held.pop(rid, None)
        if prev is not None:
            out = merge_outputs(prev, out)
        last = self.sent_at.get(rid)
        if out.finish_reason is not None:
            self.sent_at.pop(rid, None)
            return out
        if last is not None and out.num_output_tokens - last < self.stream_interval:
            self.held[rid] = out
            return None
        self.sent_at[rid] = out.num_output_tokens
        return out

    def to_replica(self, inbox: str) -> PushQueue:
        """The socket to a replica's inbox, connected the first time it is named."""
        q = self._to_replicas.get(inbox)
        if q is None:
            q = self._to_replicas[inbox] = PushQueue(inbox, bind=False, ctx=self._ctx)
        return q

    def _detokenize(self, o: StepOutput, inbox: str) -> TextOutput | None:
        """One request's text delta, or None when its step entry is dropped."""
        t0 = time.perf_counter()
        rid = o.rid
        if rid in self.stopped:
            return None  # finished here by a stop string; the scheduler is catching up
        det = self.requests.get(rid)
        if det is None:  # settings never seen (e.g. this process restarted): defaults
            det = self.requests[rid] = RequestDetokenizer(self.tokenizer)
        try:
            ids = new_ids = unpack_ids(o.new_token_ids)
        except WireError as e:
            log.warning("dropping bad token ids for %s: %s", rid, e)
            return None
        stop_token = o.stop_token_id
        if (
            stop_token is not None
            and ids
            and ids[-1] == stop_token
            and not det.include_stop_str_in_output
        ):
            ids = ids[:-1]  # as vLLM: the stop token's text is not output
        text, stop_hit = det.add_tokens(ids)
        reason = o.finish_reason
        if stop_hit:
            reason = "stop"
            self._remember_stopped(rid)
            if o.finish_reason is None:
                with contextlib.suppress(QueueFull, ValueError):  # (a bad endpoint)
                    self.to_replica(inbox).put(AbortRequest(rid, "stop_string"))
        elif reason is not None:
            text += det.finish()
            if det.stopped:
                reason = "stop"
        timing = o.timings
        if reason is None:
            self.detok_s[rid] = self.detok_s.get(rid, 0.0) + time.perf_counter() - t0
        else:  # a stop-string finish has no scheduler stamps yet
            self.requests.pop(rid, None)
            timing = dict(timing or {})
            timing["detok_time_s"] = self.detok_s.pop(rid, 0.0) + time.perf_counter() - t0
            timing["detok_sent_time"] = time.time()
        lps = self._name_tokens(new_ids, o.logprobs) if o.logprobs else o.logprobs
        return TextOutput(
            rid,
            text,
            reason,
            o.num_prompt_tokens,
            o.num_output_tokens,
            o.new_token_ids,
            lps,
            timing,
            det.stop_str if det.stop_str is not None else stop_token,
            self._name_prompt(o.prompt_logprobs) if o.prompt_logprobs else None,
        )

    def _name_prompt(self, entries: list) -> list | None:
        """Prompt logprobs [token id, logprob, tops] -> [logprob, tops, names], as
        _name_tokens does for generated tokens; None if malformed."""
        try:
            ids = [e[0] for e in entries]
            return self._name_tokens(ids, [[e[1], e[2]] for e in entries])
        except (TypeError, IndexError, KeyError):
            log.warning("dropping malformed prompt logprobs")
            return None

    def _name_tokens(self, ids: list[int], lps: list) -> list:
        """Each per-token logprob entry [logprob, [[id, logprob], ...]] gets a third item:
        the decoded strings of the token and of its top ids, for the OpenAI response."""
        try:
            wanted = [[tid, *(t for t, _ in entry[1])] for tid, entry in zip(ids, lps)]
            flat = [t for row in wanted for t in row]
            if any(type(t) is not int or not 0 <= t < self.vocab_size for t in flat):
                return lps
            texts = iter(
                self.tokenizer.decode_batch([[t] for t in flat], skip_special_tokens=False)
            )
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
        while self.running or (
            time.monotonic() - self.quiet_since < DRAIN_QUIET_S
            and time.monotonic() < self.drain_deadline
        ):
            msgs = self.inbox.get_batch(timeout_ms=int(hb * 1000 if self.running else 100))
            if msgs:
                self.quiet_since = time.monotonic()
            for msg in msgs:
                if isinstance(msg, ComponentStatus) and msg.component.startswith("scheduler"):
                    with contextlib.suppress(QueueFull):  # its "stopping", after its outputs
                        self.to_frontend.put(msg)
                    continue
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
        for q in (self.inbox, self.to_frontend, *self._to_replicas.values()):
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


def merge_outputs(a: TextOutput, b: TextOutput) -> TextOutput:
    """One request's two consecutive outputs as one: texts, token ids and logprobs
    concatenated; the counts, timings and stop reason of the later."""
    logprobs: list | None = None
    if a.logprobs is not None or b.logprobs is not None:
        logprobs = (a.logprobs or []) + (b.logprobs or [])
    return TextOutput(
        b.rid,
        a.text + b.text,
        b.finish_reason,
        b.num_prompt_tokens,
        b.num_output_tokens,
        a.token_ids + b.token_ids,  # pack_ids: int32 each, so bytes concatenate
        logprobs,
        b.timings,
        b.stop_reason,
        a.prompt_logprobs if a.prompt_logprobs is not None else b.prompt_logprobs,
    )
