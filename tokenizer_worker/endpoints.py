"""The tokenizer endpoints, answered by a tokenizer worker (never the scheduler):

    tokenize        {"prompt"} or {"messages"} (chat template applied; "tools" rendered
                    in, checked by the frontend), add_special_tokens,
                    add_generation_prompt, return_token_strs
                    -> {"count", "max_model_len", "tokens", "token_strs"}
    detokenize      {"tokens"} -> {"prompt"}
    tokenizer_info  {} -> tokenizer_config.json's fields, tokenizer_class, the chat template,
                    model_max_length, the served max_model_len and the tool_call_parser

vLLM's shapes. The frontend checks the JSON types (frontend.tokenizer_api); what depends
on the tokenizer is checked here: ids outside the vocabulary, a chat template that
refuses the messages (Rejected, a 400).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from common.sampling_params import InvalidParameterError
from tokenizer_worker.tokenization import Rejected, Tokenization


class TokenizerEndpoints:
    def __init__(self, tokenization: Tokenization, model_dir: str | Path | None = None) -> None:
        self.t = tokenization
        self.model_dir = Path(model_dir) if model_dir is not None else None
        self._info: dict[str, Any] | None = None

    def __call__(self, op: str, args: dict[str, Any]) -> dict[str, Any]:
        if op == "tokenize":
            return self.tokenize(args)
        if op == "detokenize":
            return self.detokenize(args)
        if op == "tokenizer_info":
            return self.tokenizer_info()
        raise Rejected(400, f"unknown tokenizer call {op!r}")

    def tokenize(self, args: dict[str, Any]) -> dict[str, Any]:
        messages = args.get("messages")
        if messages is not None:  # chat: the template holds the special tokens already
            ids = self.t.chat_ids(
                messages,
                add_generation_prompt=bool(args.get("add_generation_prompt", True)),
                add_special_tokens=bool(args.get("add_special_tokens", False)),
                tools=args.get("tools") if isinstance(args.get("tools"), list) else None,
                continue_final=bool(args.get("continue_final_message", False)),
            )
        else:
            prompt = args.get("prompt")
            if not isinstance(prompt, str):
                raise Rejected(400, "prompt must be a string", "prompt")
            add_special = bool(args.get("add_special_tokens", True))
            ids = self.t.tokenizer.encode(prompt, add_special_tokens=add_special).ids
        strs = None
        if args.get("return_token_strs"):
            strs = [self.t.tokenizer.id_to_token(i) or "" for i in ids]
        return {
            "count": len(ids),
            "max_model_len": self.t.max_model_len,
            "tokens": ids,
            "token_strs": strs,
        }

    def detokenize(self, args: dict[str, Any]) -> dict[str, Any]:
        ids = args.get("tokens")
        if not isinstance(ids, list) or not all(type(i) is int for i in ids):
            raise Rejected(400, "tokens must be a list of integers", "tokens")
        try:
            self.t.limits.check_token_ids(ids, "tokens")
        except InvalidParameterError as e:
            raise Rejected(400, str(e), e.param) from None
        # as vLLM (and transformers' decode): special tokens are kept
        return {"prompt": self.t.tokenizer.decode(ids, skip_special_tokens=False)}

    def tokenizer_info(self) -> dict[str, Any]:
        if self._info is None:
            cfg: dict[str, Any] = {}
            if self.model_dir is not None:
                try:
                    cfg = json.loads((self.model_dir / "tokenizer_config.json").read_text())
                except (OSError, ValueError):
                    cfg = {}
            template = self.t.chat_template
            self._info = {
                **{k: v for k, v in cfg.items() if k != "chat_template"},
                "tokenizer_class": cfg.get("tokenizer_class") or "PreTrainedTokenizerFast",
                "model_max_length": cfg.get("model_max_length", self.t.max_model_len),
                "max_model_len": self.t.max_model_len,
                "vocab_size": self.t.vocab_size,
                "chat_template": template.source if template is not None else None,
                # the format of tool calls in prompts and outputs (tokenizer_worker.tool_prompt)
                "tool_call_parser": self.t.tool_format.name,
            }
        return self._info
