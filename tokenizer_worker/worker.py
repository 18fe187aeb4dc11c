"""A tokenizer worker: raw requests in, token ids out. N of them share one endpoint.

    inbox (DEALER, connect "tokenizer", identity = its pid) ◀── TokenizeRequest,
                          TokenizerCall (the frontend's ROUTER: it picks the worker)
    ──▶ PUSH "scheduler.K": GenerateRequest (validated, tokenized), to the replica the
                           frontend chose (TokenizeRequest.replica / inbox)
    ──▶ PUSH "frontend":  RequestError (bad request), ComponentStatus (ready, heartbeat:
                          from the main loop, so a hung worker falls silent), TokenizerReply
                          (the answer to a TokenizerCall: tokenizer_worker.endpoints)

Chat requests are rendered with the model's chat template first. What depends on the
prompt is checked here, once, before it costs the scheduler anything: an empty prompt,
token ids outside the vocabulary, prompt + max_tokens beyond the context length
(common.limits, which also cuts an unset max_tokens to the prompt's room), a structured
output's spec (compiled). The parameters were validated at the frontend's intake; they
are checked again only when the request's id is not signed (common.auth.passed_intake).
No torch: this process loads only `tokenizers` and the model's config.json.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import zmq
from tokenizers import Tokenizer

from common.auth import passed_intake
from common.config import Config
from common.limits import RequestLimits
from common.log import get_logger, install_stack_dump
from common.messages import (
    ComponentStatus,
    GenerateRequest,
    RequestError,
    TokenizerCall,
    TokenizeRequest,
    TokenizerReply,
    WireError,
    pack_ids,
    unpack_ids,
)
from common.model_facts import ModelFacts, context_length, read_hf_config
from common.model_source import resolve_model
from common.sampling_params import InvalidParameterError, SamplingParams
from common.zmq_queue import DealerQueue, PushQueue, QueueFull
from tokenizer_worker.chat_template import ChatTemplate, ChatTemplateError
from tokenizer_worker.grammar import GrammarCheck, GrammarError
from tokenizer_worker.tool_prompt import default_tool_parser, has_tool_traces, render_with_tools

if TYPE_CHECKING:
    from tokenizer_worker.endpoints import TokenizerEndpoints

log = get_logger("tokenizer")

SEND_TIMEOUT_MS = 2000  # a scheduler that takes nothing this long: fail the request (503)
MAX_MESSAGES = 4096


class Rejected(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        type_: str = "invalid_request_error",
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.type = status, message, param, type_


class Tokenization:
    """The pure part: TokenizeRequest -> GenerateRequest, or Rejected. No sockets."""

    def __init__(
        self,
        model_dir: str | Path,
        max_model_len: int | None = None,
        tool_call_parser: str | None = None,
    ) -> None:
        self.model_dir = model_dir = Path(model_dir)
        self.tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        self.chat_template = ChatTemplate.from_model_dir(model_dir)
        hf = read_hf_config(model_dir)
        self.limits = RequestLimits(int(hf["vocab_size"]), context_length(hf, max_model_len))
        self.check_grammar = GrammarCheck(model_dir, self.vocab_size)  # structured outputs
        # the format of tool calls: the prompt's (tool_prompt) and the frontend's parser
        self.tool_call_parser = tool_call_parser or default_tool_parser(hf, self.chat_template)

    @property
    def vocab_size(self) -> int:
        return self.limits.vocab_size

    @property
    def max_model_len(self) -> int:
        return self.limits.max_model_len

    def prompt_ids(self, req: TokenizeRequest) -> tuple[list[int], str]:
        """(token ids, name of the parameter that carried the prompt)."""
        if req.kind == "chat":
            return self.chat_ids(req.messages, tools=req.tools), "messages"
        if req.kind != "completion":
            raise Rejected(400, f"unknown request kind {req.kind!r}")
        if req.prompt_token_ids is not None:
            try:
                return unpack_ids(req.prompt_token_ids), "prompt"
            except WireError as e:
                raise Rejected(400, f"prompt: {e}", "prompt") from None
        if not req.prompt:
            raise Rejected(400, "prompt must not be empty", "prompt")
        return self.tokenizer.encode(req.prompt, add_special_tokens=True).ids, "prompt"

    def chat_ids(
        self,
        messages: Any,
        add_generation_prompt: bool = True,
        add_special_tokens: bool = False,
        tools: list | None = None,
    ) -> list[int]:
        if self.chat_template is None:
            raise Rejected(400, "this model has no chat template; use /v1/completions", "messages")
        if not isinstance(messages, list) or not messages:
            raise Rejected(400, "messages must be a non-empty list", "messages")
        if len(messages) > MAX_MESSAGES:
            raise Rejected(400, f"at most {MAX_MESSAGES} messages, got {len(messages)}", "messages")
        for i, m in enumerate(messages):
            if not (
                isinstance(m, dict)
                and isinstance(m.get("role"), str)
                and isinstance(m.get("content"), str)
            ):
                raise Rejected(
                    400, f"messages.{i} must have a string role and content", f"messages.{i}"
                )
        try:
            if tools or has_tool_traces(messages):
                text = render_with_tools(
                    self.chat_template,
                    messages,
                    tools or [],
                    self.tool_call_parser,
                    add_generation_prompt,
                )
            else:
                text = self.chat_template.render(messages, add_generation_prompt)
        except ChatTemplateError as e:
            raise Rejected(400, f"messages: {e}", "messages") from None
        # the template already holds every special token, as in apply_chat_template
        return self.tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

    def __call__(self, req: TokenizeRequest, checked: bool = False) -> GenerateRequest:
        """`checked`: the frontend validated the parameters (its signed id says so);
        else, a frame nothing vouches for, they are validated here."""
        try:
            params = SamplingParams.from_dict(req.params)
            if not checked:
                params.validate(self.vocab_size)
        except InvalidParameterError as e:
            raise Rejected(400, str(e), e.param) from None
        except (TypeError, ValueError) as e:
            raise Rejected(400, f"invalid sampling parameters: {e}") from None
        if params.structured is not None:
            try:
                self.check_grammar(params.structured)
            except GrammarError as e:
                raise Rejected(400, f"structured: {e}", "structured") from None
        ids, where = self.prompt_ids(req)
        try:
            self.limits.check_token_ids(ids, where)  # a client's ids, or text's past the model
            self.limits.check(ids, params, where, max_tokens_unset=req.max_tokens_unset)
        except InvalidParameterError as e:
            raise Rejected(400, str(e), e.param) from None
        return GenerateRequest(req.rid, pack_ids(ids), params.to_dict(), time.time(), req.origin)


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
        ctx: zmq.Context = zmq.Context.instance()
        self.inbox = DealerQueue(
            config.ipc.endpoint("tokenizer"), identity=str(os.getpid()).encode(), ctx=ctx
        )
        self._ctx = ctx
        self._to_replicas: dict[str, PushQueue] = {}  # inbox endpoint -> a socket to it
        self.to_frontend = PushQueue(config.ipc.endpoint("frontend"), bind=False, ctx=ctx)
        self.running = True
        self.drain_deadline = 0.0
        self.last_heartbeat = 0.0
        self.num_done = 0
        self.endpoints: TokenizerEndpoints | None = None  # made on the first call

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
            self._error(msg.rid, e)
            return
        except Exception as e:  # a bug must cost one request, never the worker
            log.exception("tokenizing %s failed", msg.rid)
            self._error(
                msg.rid,
                Rejected(500, f"internal error while tokenizing: {e}", type_="server_error"),
            )
            return
        try:
            self.to_replica(msg).put(out, timeout_ms=SEND_TIMEOUT_MS)
        except QueueFull:
            self._error(
                msg.rid, Rejected(503, "the engine is not accepting requests", type_="server_error")
            )
            return
        except WireError as e:  # e.g. a prompt beyond the frame limit
            self._error(msg.rid, Rejected(400, f"request too large: {e}", "prompt"))
            return
        except ValueError as e:  # an inbox that is no endpoint (the frontend's bug)
            self._error(msg.rid, Rejected(500, f"bad replica inbox: {e}", type_="server_error"))
            return
        self.num_done += 1

    def answer(self, call: TokenizerCall) -> None:
        """A /tokenize, /detokenize or /tokenizer_info call: the reply goes to the frontend."""
        if self.endpoints is None:
            from tokenizer_worker.endpoints import TokenizerEndpoints

            self.endpoints = TokenizerEndpoints(self.tokenization, self.tokenization.model_dir)
        try:
            reply = TokenizerReply(call.call_id, 200, self.endpoints(call.op, call.args))
        except Rejected as e:
            reply = TokenizerReply(call.call_id, e.status, {"message": e.message, "param": e.param})
        except Exception as e:  # a bug must cost one call, never the worker
            log.exception("tokenizer call %s failed", call.op)
            reply = TokenizerReply(call.call_id, 500, {"message": f"internal error: {e}"})
        try:
            self.to_frontend.put(reply, timeout_ms=SEND_TIMEOUT_MS)
        except WireError as e:  # e.g. an answer beyond the frame limit
            err = {"message": f"answer too large: {e}", "param": None}
            with contextlib.suppress(QueueFull, WireError):
                self.to_frontend.put(TokenizerReply(call.call_id, 400, err))
        except QueueFull:
            log.error("frontend unreachable; dropped the answer to a %s call", call.op)

    def to_replica(self, msg: TokenizeRequest) -> PushQueue:
        """The socket to the chosen replica's inbox, connected the first time it is named
        (a replica that joins later needs no restart here)."""
        inbox = msg.inbox or self.config.ipc.replica_endpoint(msg.replica)
        q = self._to_replicas.get(inbox)
        if q is None:
            q = self._to_replicas[inbox] = PushQueue(inbox, bind=False, ctx=self._ctx)
        return q

    def _error(self, rid: str, e: Rejected) -> None:
        try:
            self.to_frontend.put(
                RequestError(rid, e.status, e.message, e.type, e.param), timeout_ms=SEND_TIMEOUT_MS
            )
        except QueueFull:
            log.error("frontend unreachable; dropped error for %s", rid)

    def heartbeat(self, kind: str = "heartbeat") -> None:
        with contextlib.suppress(QueueFull):
            self.to_frontend.put(
                ComponentStatus("tokenizer", os.getpid(), kind, time.time(), self.facts)
            )
        self.last_heartbeat = time.monotonic()

    def run(self) -> None:
        self.heartbeat("ready")
        hb = self.config.heartbeat_s
        while True:
            msgs = self.inbox.get_batch(timeout_ms=int(hb * 1000) if self.running else 100)
            if not self.running and (not msgs or time.monotonic() >= self.drain_deadline):
                break  # draining: the pipe ran dry (or the drain timed out)
            for msg in msgs:
                self.handle(msg)
                if time.monotonic() - self.last_heartbeat >= hb:  # a long batch: still here
                    self.heartbeat()
            if time.monotonic() - self.last_heartbeat >= hb:
                self.heartbeat()
        self.heartbeat("stopping")
        for q in (self.inbox, self.to_frontend, *self._to_replicas.values()):
            q.close()

    def stop(self, *_args: Any) -> None:
        """SIGTERM: tokenize what is already in this worker's pipe (the frontend accepted
        it before it began to drain), stop once the pipe is empty; a second signal stops
        after the current batch."""
        if not self.running:
            self.drain_deadline = 0.0
            return
        self.running = False
        self.drain_deadline = time.monotonic() + self.config.server.drain_timeout_s


def run(config: Config) -> None:
    install_stack_dump()
    worker = TokenizerWorker(config)
    signal.signal(signal.SIGTERM, worker.stop)
    signal.signal(signal.SIGINT, worker.stop)
    log.info(
        "tokenizer ready (pid %d): context %d, vocab %d",
        os.getpid(),
        worker.tokenization.max_model_len,
        worker.tokenization.vocab_size,
    )
    worker.run()
