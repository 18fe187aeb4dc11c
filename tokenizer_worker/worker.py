"""A tokenizer worker: raw requests in, token ids out. N of them share one endpoint.

    inbox (DEALER, connect "tokenizer.I" of every frontend I, identity = its pid)
                          ◀── TokenizeRequest, TokenizerCall (a frontend's ROUTER: it
                          picks the worker)
    ──▶ PUSH "scheduler.K": GenerateRequest (validated, tokenized), to the replica the
                           frontend chose (TokenizeRequest.replica / inbox)
    ──▶ PUSH "frontend.I": RequestError (bad request) and TokenizerReply (the answer to a
                          TokenizerCall: tokenizer_worker.endpoints) to the frontend that
                          sent it; ComponentStatus (ready, heartbeat: from the main loop,
                          so a hung worker falls silent) to every frontend

What depends on the prompt is checked once, before it costs the scheduler anything
(tokenizer_worker.tokenization, the pure part); this file carries its result.
No torch: this process loads only `tokenizers` and the model's config.json.
"""

from __future__ import annotations

import contextlib
import os
import time
from typing import Any

from common.auth import passed_intake
from common.config import Config
from common.log import get_logger, install_stack_dump
from common.messages import (
    ComponentStatus,
    RequestError,
    TokenizerCall,
    TokenizeRequest,
    TokenizerReply,
    WireError,
)
from common.model_facts import ModelFacts
from common.model_files.model_source import resolve_model
from common.worker_shell import DRAIN_POLL_MS, WorkerShell, on_stop_signals
from common.zmq_queue import DealerQueue, PushQueue, QueueFull
from tokenizer_worker.endpoints import TokenizerEndpoints
from tokenizer_worker.tokenization import Rejected, Tokenization

log = get_logger("tokenizer")

SEND_TIMEOUT_MS = 2000  # a scheduler that takes nothing this long: fail the request (503)

__all__ = ["Rejected", "Tokenization", "TokenizerWorker", "run"]  # the first two: .tokenization


class TokenizerWorker:
    def __init__(self, config: Config, tokenization: Tokenization | None = None) -> None:
        self.config = config
        if tokenization is None:
            mc = config.engine.model
            model_dir = resolve_model(mc.model, mc.resolved_cache_dir)
            tokenization = Tokenization(model_dir, mc.max_model_len, config.server.tool_call_parser)
        self.tokenization = tokenization
        # announced in every status; the frontend sends nothing to a worker that disagrees
        # with the replicas (block_size 0: no KV cache here)
        self.facts = ModelFacts(
            config.model_name, tokenization.vocab_size, tokenization.max_model_len, 0
        ).to_wire()
        # a DEALER connected to every frontend's ROUTER: each frontend picks its workers
        eps = [config.ipc.tokenizer_endpoint(i) for i in range(config.api_servers)]
        inbox = DealerQueue(eps[0], identity=str(os.getpid()).encode(), more=tuple(eps[1:]))
        # on SIGTERM: tokenize what is already in this worker's pipe (the frontend accepted
        # it before it began to drain), stop once a poll finds the pipe empty; beats come
        # from the loop, so a worker hung inside a request falls silent
        self.shell = WorkerShell(
            config, "tokenizer", inbox, self.heartbeat, beacon=False, quiet_s=DRAIN_POLL_MS / 1000
        )
        self.inbox, self.to_frontend = inbox, self.shell.to_frontend
        self.num_done = 0
        self.endpoints = TokenizerEndpoints(tokenization, tokenization.model_dir)

    def handle(self, msg: Any) -> None:
        if isinstance(msg, TokenizerCall):
            self.answer(msg)
            return
        if not isinstance(msg, TokenizeRequest):
            log.warning("dropping unexpected %s on the tokenizer inbox", type(msg).__name__)
            return
        try:
            out = self.tokenization(msg, passed_intake(self.config.ipc.secret, msg.rid))
        except Rejected as e:
            self._error(msg, e)
            return
        except Exception as e:  # a bug must cost one request, never the worker
            log.exception("tokenizing %s failed", msg.rid)
            self._error(
                msg,
                Rejected(500, f"internal error while tokenizing: {e}", type_="server_error"),
            )
            return
        try:
            self.to_replica(msg).put(out, timeout_ms=SEND_TIMEOUT_MS)
        except QueueFull:
            self._error(
                msg, Rejected(503, "the engine is not accepting requests", type_="server_error")
            )
            return
        except WireError as e:  # e.g. a prompt beyond the frame limit
            self._error(msg, Rejected(400, f"request too large: {e}", "prompt"))
            return
        except ValueError as e:  # an inbox that is no endpoint (the frontend's bug)
            self._error(msg, Rejected(500, f"bad replica inbox: {e}", type_="server_error"))
            return
        self.num_done += 1

    def answer(self, call: TokenizerCall) -> None:
        """A /tokenize, /detokenize or /tokenizer_info call: the reply goes to the frontend."""
        try:
            reply = TokenizerReply(call.call_id, 200, self.endpoints(call.op, call.args))
        except Rejected as e:
            reply = TokenizerReply(call.call_id, e.status, {"message": e.message, "param": e.param})
        except Exception as e:  # a bug must cost one call, never the worker
            log.exception("tokenizer call %s failed", call.op)
            reply = TokenizerReply(call.call_id, 500, {"message": f"internal error: {e}"})
        try:
            self.to_frontend.put(reply, call.frontend, timeout_ms=SEND_TIMEOUT_MS)
        except WireError as e:  # e.g. an answer beyond the frame limit
            err = {"message": f"answer too large: {e}", "param": None}
            with contextlib.suppress(QueueFull, WireError):
                self.to_frontend.put(TokenizerReply(call.call_id, 400, err), call.frontend)
        except QueueFull:
            log.error("frontend unreachable; dropped the answer to a %s call", call.op)

    def to_replica(self, msg: TokenizeRequest) -> PushQueue:
        """The socket to the chosen replica's inbox, connected the first time it is named
        (a replica that joins later needs no restart here)."""
        return self.shell.replicas.get(msg.inbox or self.config.ipc.replica_endpoint(msg.replica))

    def _error(self, req: TokenizeRequest, e: Rejected) -> None:
        """The request's error, to the frontend that accepted it."""
        try:
            self.to_frontend.put(
                RequestError(req.rid, e.status, e.message, e.type, e.param),
                req.frontend,
                timeout_ms=SEND_TIMEOUT_MS,
            )
        except QueueFull:
            log.error("frontend %d unreachable; dropped error for %s", req.frontend, req.rid)

    def heartbeat(self, kind: str = "heartbeat") -> None:
        self.to_frontend.broadcast(
            ComponentStatus("tokenizer", os.getpid(), kind, time.time(), self.facts)
        )

    def run(self) -> None:
        self.shell.run(self.handle)

    def stop(self, *_args: Any) -> None:
        """SIGTERM: finish what is in the pipe, then stop; a second signal: after this batch."""
        self.shell.stop()


def run(config: Config) -> None:
    install_stack_dump()
    worker = TokenizerWorker(config)
    on_stop_signals(worker.stop)
    log.info(
        "tokenizer ready (pid %d): context %d, vocab %d",
        os.getpid(),
        worker.tokenization.max_model_len,
        worker.tokenization.vocab_size,
    )
    worker.run()
