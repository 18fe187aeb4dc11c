"""The detokenizer process: token ids in, text deltas out, one message per engine step.

    inbox (PULL, bind "detok") ◀── StepOutputs (every scheduler replica)
    ──▶ PUSH "frontend.I": TextOutputs (per StepOutputs, one for each frontend with a
                          request in the step: the one that accepted it), ComponentStatus
                          (every frontend)
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
import time
from collections import OrderedDict
from typing import Any

from tokenizers import Tokenizer

from common.config import Config
from common.log import get_logger, install_stack_dump
from common.messages import (
    AbortRequest,
    ComponentStatus,
    Message,
    StepOutput,
    StepOutputs,
    TextOutput,
    TextOutputs,
    WireError,
    join_outputs,
    pack_text_outputs,
    unpack_ids,
    unpack_step_outputs,
)
from common.model_files.model_source import resolve_model
from common.model_files.tokenizer_files import load_decode_tokenizer
from common.worker_shell import WorkerShell, on_stop_signals
from common.zmq_queue import PullQueue, QueueFull
from detok_worker.incremental import RequestDetokenizer

log = get_logger("detok")

STOPPED_MEMORY = 100_000  # rids finished here by a stop string, to drop their late tokens
DRAIN_QUIET_S = 2.0  # on SIGTERM, stop once no step arrived for this long (and not busy())
REPLICA_SILENT_S = 10.0  # busy(): a replica silent this long, with no "stopping", is gone


class DetokWorker:
    def __init__(self, config: Config, tokenizer: Tokenizer | None = None) -> None:
        self.config = config
        if tokenizer is None:
            model_dir = resolve_model(
                config.engine.model.model, config.engine.model.resolved_cache_dir
            )
            tokenizer = load_decode_tokenizer(model_dir)  # no merges: a faster start
        self.tokenizer = tokenizer
        self.vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
        inbox = PullQueue(config.ipc.endpoint("detok"), bind=True)
        # on SIGTERM: keep detokenizing while the schedulers still send steps (they drain
        # too: see busy()), until DRAIN_QUIET_S without any; liveness from a thread, so a
        # long batch is not mistaken for a death
        self.shell = WorkerShell(
            config, "detok", inbox, self.heartbeat, beacon=True, quiet_s=DRAIN_QUIET_S
        )
        self.inbox, self.to_frontend = inbox, self.shell.to_frontend
        self.requests: dict[str, RequestDetokenizer] = {}
        self.stopped: OrderedDict[str, None] = OrderedDict()
        self.detok_s: dict[str, float] = {}  # rid -> seconds spent detokenizing it so far
        self.stream_interval = config.server.stream_interval
        self.held: dict[str, TextOutput] = {}  # rid -> output not sent yet (stream interval)
        self.sent_at: dict[str, int] = {}  # rid -> its num_output_tokens when last sent
        self.stepping: dict[int, float] = {}  # replica -> its last step, until its "stopping"
        self.num_frontends = config.api_servers
        self.frontend_of: dict[str, int] = {}  # rid -> the frontend it goes to (N > 1 only)
        self.dropping: set[int] = set()  # frontends whose outputs are being dropped

    def process(self, msg: StepOutputs) -> TextOutputs:
        """The step's text, every request's, as one message."""
        return pack_text_outputs(self.texts(msg), msg.replica, msg.prefix_cache)

    def by_frontend(self, msg: StepOutputs) -> list[tuple[int, TextOutputs]]:
        """The step's text as one message per frontend that has a request in it."""
        kept = self.texts(msg)
        if self.num_frontends == 1:
            return [(0, pack_text_outputs(kept, msg.replica, msg.prefix_cache))]
        groups: dict[int, list[TextOutput]] = {}
        for t in kept:
            f = self.frontend_of.get(t.rid, 0)
            if t.finish_reason is not None:
                self.frontend_of.pop(t.rid, None)
            groups.setdefault(f, []).append(t)
        return [(f, pack_text_outputs(g, msg.replica, msg.prefix_cache)) for f, g in groups.items()]

    def texts(self, msg: StepOutputs) -> list[TextOutput]:
        """One step's text deltas, those held back by the stream interval left out."""
        try:
            outputs = unpack_step_outputs(msg)
        except WireError as e:
            log.warning("dropping step %d: %s", msg.step, e)
            return []
        for rid, stop, skip_special, include_stop, frontend, min_tokens in msg.new_requests:
            self.requests[rid] = RequestDetokenizer(
                self.tokenizer, stop, skip_special, include_stop, min_tokens
            )
            if self.num_frontends > 1:
                self.frontend_of[rid] = frontend
        inbox = msg.inbox or self.config.ipc.replica_endpoint(msg.replica)
        texts = (self._detokenize(o, inbox) for o in outputs)
        if self.stream_interval > 1:
            texts = (self._coalesce(t) for t in texts if t is not None)
        return [t for t in texts if t is not None]

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
                    self.shell.replicas.get(inbox).put(AbortRequest(rid, "stop_string"))
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
        self.to_frontend.broadcast(ComponentStatus("detok", os.getpid(), kind, time.time()))

    def handle(self, msg: Message) -> None:
        """One inbox message: a step to detokenize (its text to the frontend), or a
        scheduler's "stopping", passed on behind the outputs it sent before it."""
        if isinstance(msg, ComponentStatus) and msg.component.startswith("scheduler"):
            self.to_frontend.broadcast(msg)
            if msg.kind == "stopping":
                k = msg.component.partition(".")[2]
                self.stepping.pop(int(k) if k.isdigit() else 0, None)
            return
        if not isinstance(msg, StepOutputs):
            log.warning("dropping unexpected %s on the detok inbox", type(msg).__name__)
            return
        self.stepping[msg.replica] = time.monotonic()
        try:
            results = self.by_frontend(msg)
        except Exception:  # a bug must cost one step, never the worker
            log.exception("detokenizing step %d failed; dropped", msg.step)
            return
        # one frontend: wait for room (it is the only reader); several: never let one
        # that died or hangs (its queue full: HWM messages behind) stall the others
        timeout = None if self.num_frontends == 1 else 0
        for frontend, result in results:
            if not result.rids:
                continue
            try:
                self.to_frontend.put(result, frontend, timeout_ms=timeout)
                self.dropping.discard(frontend)
            except QueueFull:
                if frontend not in self.dropping:  # once until it takes outputs again
                    self.dropping.add(frontend)
                    log.error("frontend %d takes no outputs (queue full): dropping them", frontend)

    def busy(self) -> bool:
        """Draining: a replica may still send steps (it stepped, and has not said
        "stopping"). A step can stall for seconds on a loaded machine, longer than the
        quiet period; a replica killed without a word counts for REPLICA_SILENT_S only."""
        now = time.monotonic()
        return any(now - t < REPLICA_SILENT_S for t in self.stepping.values())

    def run(self) -> None:
        self.shell.run(self.handle, self.busy)

    def stop(self, *_args: Any) -> None:
        """SIGTERM: drain until the schedulers fall quiet; a second signal stops now."""
        self.shell.stop()


def run(config: Config) -> None:
    install_stack_dump()
    worker = DetokWorker(config)
    on_stop_signals(worker.stop)
    log.info("detok ready (pid %d)", os.getpid())
    worker.run()


def merge_outputs(a: TextOutput, b: TextOutput) -> TextOutput:
    """One request's two consecutive outputs as one: texts, token ids and logprobs
    concatenated; the counts, timings and stop reason of the later."""
    return join_outputs(a, b, ("text", "token_ids", "logprobs"))
