"""A thread standing in for the tokenizer pool, the scheduler and the detok worker.

It takes TokenizeRequests as tokenizer worker os.getpid() (a DEALER on "tokenizer"; with
`add_tokenizer()`, a second one, STRANDED_PID, too), records AbortRequests (PULL bind
"scheduler") and pushes to the frontend inbox (PUSH connect "frontend"): component
statuses, then one TextOutputs per step covering every active request, like the real
detok. The prompt (or the last chat message) picks the behaviour:

    "bad"        RequestError 400 naming `prompt`
    "hold"       nothing, until aborted
    "stranded"   the tokenizer worker that got it falls silent (dead or hung): no output
    "slow"       "tok " every 50 ms, for 20 s
    "fail-late"  "Hello", then a RequestError 500
    "think"      THINK_WORDS one per step: reasoning "Let me see", then "Hello world"
    anything     "Hello", " world", "!" one per step; "length" if max_tokens <= 3 else "stop"

Every step also carries an entry for a rid nobody asked for, which the frontend must drop.
A prompt of token ids seen before finishes with its whole blocks but the last token counted
as prefix-cache hits (timings' num_cached_tokens), as the scheduler does.
TokenizerCalls (/tokenize, ...) are answered with one token per character, its code point.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field, replace

from common.config import Config
from common.limits import settle_max_tokens
from common.messages import (
    AbortRequest,
    ComponentStatus,
    EngineStatus,
    RequestError,
    TextOutput,
    TokenizerCall,
    TokenizeRequest,
    TokenizerReply,
    pack_ids,
    pack_text_outputs,
    unpack_ids,
)
from common.zmq_queue import DealerQueue, PullQueue, PushQueue

WORDS = ("Hello", " world", "!")
# "think": reasoning first, its tags split across steps (frontend.reasoning)
THINK_WORDS = ("<th", "ink>Let me", " see</th", "ink>Hello", " world")
NUM_PROMPT_TOKENS = 5
MAX_MODEL_LEN = 2048
BLOCK_SIZE = 4  # not the config's 16: routing must key on the announced one
WEIGHT_BYTES = 123_456_789  # what the fake replica reports (zeroserve:model_weight_bytes)
DEVICE, GPUS = "NVIDIA H200", ["3"]  # ... and where it says it runs (launch.py's GPU 3)
STRANDED_PID = 2**31 - 2  # no such process


@dataclass
class _Active:
    req: TokenizeRequest
    mode: str
    prompt_len: int
    next_at: float = 0.0
    num_out: int = 0
    texts: list[str] = field(default_factory=list)
    num_cached_tokens: int = 0


class FakeBackend:
    def __init__(self, config: Config, ready: bool = True, step_s: float = 0.01) -> None:
        self.config = config
        self.step_s = step_s
        self.output_replica = 0  # the replica its TextOutputs say stepped
        # tokenizer worker pid -> its DEALER (None: the thread makes it); those fallen silent
        self._tokenizers: dict[int, DealerQueue | None] = {os.getpid(): None}
        self._silent: set[int] = set()
        self.requests: list[TokenizeRequest] = []
        self.aborts: list[AbortRequest] = []
        self.calls: list[TokenizerCall] = []
        self._seen_prompts: set[bytes] = set()  # token-id prompts, for the prefix "cache"
        self.num_output_msgs = 0
        self.max_rids_per_msg = 0
        self.lock = threading.Lock()
        self._ready = threading.Event()
        if ready:
            self._ready.set()
        self._beating = threading.Event()
        self._beating.set()
        self._stop = threading.Event()
        self._active: dict[str, _Active] = {}
        self._inject: list = []
        self._thread = threading.Thread(target=self._run, name="fake-backend", daemon=True)

    # -- test API ---------------------------------------------------------------------------
    def start(self) -> FakeBackend:
        self._thread.start()
        return self

    def announce(self) -> None:
        """Start sending ready statuses and heartbeats."""
        self._ready.set()

    def add_tokenizer(self) -> None:
        """A second tokenizer worker (pid STRANDED_PID) joins."""
        with self.lock:
            self._tokenizers.setdefault(STRANDED_PID, None)

    def pause_heartbeats(self, paused: bool = True) -> None:
        if paused:
            self._beating.clear()
        else:
            self._beating.set()

    def send(self, msg) -> None:
        """Push an arbitrary message to the frontend inbox from the backend thread."""
        with self.lock:
            self._inject.append(msg)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def wait_for(self, predicate, timeout_s: float = 5.0) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self.lock:
                if predicate(self):
                    return True
            time.sleep(0.005)
        return False

    def aborted(self) -> dict[str, str]:
        with self.lock:
            return {a.rid: a.reason for a in self.aborts}

    # -- the thread -------------------------------------------------------------------------
    def _run(self) -> None:
        ipc = self.config.ipc
        tokenizers = self._tokenizers
        aborts_in = PullQueue(ipc.endpoint("scheduler"), bind=True)
        out = PushQueue(ipc.endpoint("frontend"), bind=False)
        last_beat = 0.0
        try:
            while not self._stop.is_set():
                now = time.monotonic()
                beating = self._ready.is_set() and self._beating.is_set()
                with self.lock:
                    for pid, q in tokenizers.items():  # the thread's own sockets
                        if q is None:
                            tokenizers[pid] = DealerQueue(
                                ipc.endpoint("tokenizer"), identity=str(pid).encode()
                            )
                            last_beat = 0.0  # announce it now
                if beating and now - last_beat >= self.config.heartbeat_s:
                    self._heartbeat(out, "ready" if last_beat == 0.0 else "heartbeat")
                    last_beat = now
                for pid, q in list(tokenizers.items()):
                    if pid in self._silent or q is None:
                        continue  # a dead or hung worker: what it got stays in its queue
                    for msg in q.drain():
                        if isinstance(msg, TokenizerCall):
                            self._answer(msg, out)
                        elif self._admit(msg, out):
                            self._silent.add(pid)
                for msg in aborts_in.drain():
                    if not isinstance(msg, AbortRequest):  # e.g. the frontend's heartbeat
                        continue
                    with self.lock:
                        self.aborts.append(msg)
                    self._active.pop(msg.rid, None)
                with self.lock:
                    inject, self._inject = self._inject, []
                for msg in inject:
                    out.put(msg, timeout_ms=1000)
                self._step(out, now)
                time.sleep(self.step_s)
        finally:
            for q in (*tokenizers.values(), aborts_in, out):
                if q is not None:
                    q.close()

    def _heartbeat(self, out: PushQueue, kind: str) -> None:
        t = time.time()
        for pid in self._tokenizers:
            if pid not in self._silent:
                out.put(ComponentStatus("tokenizer", pid, kind, t), timeout_ms=1000)
        out.put(ComponentStatus("detok", os.getpid(), kind, t), timeout_ms=1000)
        out.put(
            EngineStatus(
                kind,
                len(self._active),
                0,
                0.25,
                30,
                40,
                100,
                40,
                self.config.model_name,
                MAX_MODEL_LEN,
                49152,
                t,
                pid=os.getpid(),
                weight_bytes=WEIGHT_BYTES,
                block_size=BLOCK_SIZE,
                device=DEVICE,
                gpus=GPUS,
            ),
            timeout_ms=1000,
        )

    def _admit(self, req: TokenizeRequest, out: PushQueue) -> bool:
        """True when the tokenizer worker that got it falls silent ("stranded")."""
        with self.lock:
            self.requests.append(req)
        text = req.prompt
        if req.kind == "chat":
            text = req.messages[-1]["content"] if req.messages else ""
        modes = ("bad", "hold", "slow", "fail-late", "stranded", "think", "nonfinite")
        mode = text if text in modes else "words"
        if mode == "stranded":
            return True
        if mode == "bad":
            out.put(RequestError(req.rid, 400, "prompt is bad", "invalid_request_error", "prompt"))
        elif mode != "hold":
            ids = req.prompt_token_ids
            prompt_len = NUM_PROMPT_TOKENS if ids is None else len(unpack_ids(ids))
            a = self._active[req.rid] = _Active(req, mode, prompt_len)
            if ids is not None and bytes(ids) in self._seen_prompts:
                a.num_cached_tokens = (prompt_len - 1) // BLOCK_SIZE * BLOCK_SIZE
            elif ids is not None:
                self._seen_prompts.add(bytes(ids))
        return False

    def _answer(self, call: TokenizerCall, out: PushQueue) -> None:
        """The tokenizer endpoints with one token per character (its code point)."""
        with self.lock:
            self.calls.append(call)
        args, status, body = call.args, 200, {}
        if call.op == "tokenize":
            text = args.get("prompt")
            if text is None:
                text = "".join(m["content"] for m in args["messages"])
            ids = [ord(c) for c in text]
            body = {"count": len(ids), "max_model_len": MAX_MODEL_LEN, "tokens": ids}
        elif call.op == "detokenize":
            if all(0 <= t < 0x110000 for t in args["tokens"]):
                body = {"prompt": "".join(chr(t) for t in args["tokens"])}
            else:
                status, body = 400, {"message": "tokens: outside the vocabulary", "param": "tokens"}
        else:
            body = {"tokenizer_class": "FakeTokenizer", "max_model_len": MAX_MODEL_LEN}
        out.put(TokenizerReply(call.call_id, status, body), timeout_ms=1000)

    def _step(self, out: PushQueue, now: float) -> None:
        entries = []
        for rid, a in list(self._active.items()):
            if a.mode == "slow" and now < a.next_at:
                continue
            a.num_out += 1
            params = a.req.params
            if a.mode == "slow":
                a.next_at = now + 0.05
                text, finish = "tok ", ("length" if a.num_out >= 400 else None)
            elif a.mode == "fail-late" and a.num_out > 1:
                del self._active[rid]
                out.put(RequestError(rid, 500, "engine exploded", "server_error", None))
                continue
            else:
                words = THINK_WORDS if a.mode == "think" else WORDS
                worded = a.mode in ("words", "think", "nonfinite")
                text = words[a.num_out - 1] if worded else "Hello"
                finish = None
                settled = replace(params)  # an unset one settled, as the tokenizer does
                settle_max_tokens(settled, a.prompt_len, MAX_MODEL_LEN)
                max_tokens = settled.max_tokens
                if worded and a.num_out >= min(max_tokens, len(words)):
                    finish = "length" if max_tokens <= len(words) else "stop"
            lp = None
            if params.logprobs is not None:
                top = [[100 + k, -0.5 - k] for k in range(params.logprobs)]
                lp = [[-0.5, top]]
                if a.mode == "nonfinite":  # overflowed logits: no finite logprob
                    bad = (float("-inf"), float("nan"), float("inf"))
                    lp = [[float("nan"), [[100 + k, bad[k % 3]] for k in range(params.logprobs)]]]
            timings = None  # on the finishing output, as the scheduler's
            if finish is not None:  # the arrival stays in the frontend: it adds it
                wall = time.time()
                timings = {
                    "scheduler_received_time": wall - 0.002,
                    "first_scheduled_time": wall,
                    "num_cached_tokens": a.num_cached_tokens,
                }
            plp = None  # prompt token p: logprob -p, tops "t<k>" at -0.25 * (k + 1)
            if a.num_out == 1 and params.prompt_logprobs is not None:
                k = params.prompt_logprobs
                plp = [[None, [], ["p0"]]] + [
                    [
                        -float(p),
                        [[200 + j, -0.25 * (j + 1)] for j in range(k)],
                        [f"p{p}", *(f"t{j}" for j in range(k))],
                    ]
                    for p in range(1, a.prompt_len)
                ]
            entries.append(
                TextOutput(
                    rid,
                    text,
                    finish,
                    a.prompt_len,
                    a.num_out,
                    pack_ids([10 + a.num_out]),
                    lp,
                    timings,
                    prompt_logprobs=plp,
                )
            )
            if finish is not None:
                del self._active[rid]
        if not entries:
            return
        entries.append(TextOutput("ghost-rid", "boo", None, 1, 1, pack_ids([1])))
        # replica 0, whose prefix cache has seen 100 tokens queried, 40 hit (its EngineStatus)
        out.put(pack_text_outputs(entries, self.output_replica, [100, 40]), timeout_ms=1000)
        with self.lock:
            self.num_output_msgs += 1
            self.max_rids_per_msg = max(self.max_rids_per_msg, len(entries) - 1)
