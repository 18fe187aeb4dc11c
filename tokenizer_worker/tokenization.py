"""The pure part of a tokenizer worker: TokenizeRequest -> GenerateRequest, or Rejected.

Chat requests are rendered with the model's chat template first. What depends on the
prompt is checked here, once, before it costs the scheduler anything: an empty prompt,
token ids outside the vocabulary, prompt + max_tokens beyond the context length
(common.limits, which also cuts an unset max_tokens to the prompt's room), a structured
output's spec (compiled), a prediction longer than the context. The parameters were
validated at the frontend's intake; they are checked again only when the request's id
is not signed (common.auth.passed_intake).
No sockets (tokenizer_worker.worker carries the results), no torch: only `tokenizers`
and the model's config.json.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from common.limits import RequestLimits
from common.messages import (
    GenerateRequest,
    TokenizeRequest,
    WireError,
    pack_ids,
    unpack_ids,
)
from common.model_facts import context_length, read_hf_config
from common.sampling_params import InvalidParameterError
from common.tool_formats import tool_format
from tokenizer_worker.chat_template import ChatTemplate, ChatTemplateError, cut_after_final
from tokenizer_worker.grammar import GrammarCheck, GrammarError
from tokenizer_worker.tool_prompt import family_tool_format, has_tool_traces, render_with_tools

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
        self.tool_format = (
            tool_format(tool_call_parser)
            if tool_call_parser
            else family_tool_format(hf, self.chat_template)
        )

    @property
    def vocab_size(self) -> int:
        return self.limits.vocab_size

    @property
    def max_model_len(self) -> int:
        return self.limits.max_model_len

    def prompt_ids(self, req: TokenizeRequest) -> tuple[list[int], str]:
        """(token ids, name of the parameter that carried the prompt)."""
        if req.kind == "chat":
            extra, cont = req.chat_template_kwargs or {}, req.continue_final
            ids = self.chat_ids(req.messages, tools=req.tools, extra=extra, continue_final=cont)
            return ids, "messages"
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
        extra: dict[str, Any] | None = None,
        continue_final: bool = False,
    ) -> list[int]:
        """`extra`: more chat template variables (a request's chat_template_kwargs).
        `continue_final`: the prompt ends inside the final (assistant) message, for the
        model to continue (continue_final_message: no generation prompt, the text cut
        right after that message's content)."""
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
        if continue_final:
            add_generation_prompt = False
            if messages[-1]["role"] != "assistant":
                where = f"messages.{len(messages) - 1}"
                raise Rejected(400, f"{where} is not an assistant message to continue", where)
        try:
            if tools or has_tool_traces(messages):
                text = render_with_tools(
                    self.chat_template,
                    messages,
                    tools or [],
                    self.tool_format,
                    add_generation_prompt,
                    **(extra or {}),
                )
            else:
                text = self.chat_template.render(messages, add_generation_prompt, **(extra or {}))
            if continue_final:
                text = cut_after_final(text, messages[-1]["content"])
        except ChatTemplateError as e:
            raise Rejected(400, f"messages: {e}", "messages") from None
        # the template already holds every special token, as in apply_chat_template
        return self.tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

    def __call__(self, req: TokenizeRequest, checked: bool = False) -> GenerateRequest:
        """`checked`: the frontend validated the parameters (its signed id says so);
        else, a frame nothing vouches for, they are validated here."""
        # a typed struct (its fields' types checked on decode), copied: settling its
        # max_tokens must not change the message it came in
        params = dataclasses.replace(req.params)
        if not checked:
            try:
                params.validate(self.vocab_size)
            except InvalidParameterError as e:
                raise Rejected(400, str(e), e.param) from None
        if params.structured is not None:
            try:
                self.check_grammar(params.structured)
            except GrammarError as e:
                raise Rejected(400, f"structured: {e}", "structured") from None
        ids, where = self.prompt_ids(req)
        # OpenAI's `prediction`: its text as the output would hold it (no special tokens)
        pred = (
            None
            if req.prediction is None
            else self.tokenizer.encode(req.prediction, add_special_tokens=False).ids
        )
        try:
            self.limits.check_token_ids(ids, where)  # a client's ids, or text's past the model
            self.limits.check(ids, params, where)  # settles an unset max_tokens
            if pred is not None:
                self.limits.check_prediction(pred)
        except InvalidParameterError as e:
            raise Rejected(400, str(e), e.param) from None
        return GenerateRequest(
            req.rid,
            pack_ids(ids),
            params,
            time.time(),
            req.origin,
            req.frontend,
            None if pred is None else pack_ids(pred),
        )
