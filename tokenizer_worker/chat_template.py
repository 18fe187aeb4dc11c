"""Chat templates rendered the way transformers renders them, without importing it.

transformers' `apply_chat_template` compiles the tokenizer_config.json template in an
immutable sandboxed Jinja environment with trim_blocks/lstrip_blocks, the loop-controls
extension, a `tojson` filter, and the `raise_exception` / `strftime_now` globals; the
special-token strings of the config (bos_token, eos_token, ...) are template variables.
We do the same so tokenizer workers never import transformers (and with it torch), and
the tests check that both produce the same token ids.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment


class ChatTemplateError(ValueError):
    """The template refused the conversation (raise_exception) or failed to render."""


def _raise_exception(message: str) -> None:
    raise ChatTemplateError(message)


def _tojson(
    x: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _token_str(v: Any) -> str | None:
    if isinstance(v, str):
        return v
    if isinstance(v, dict) and isinstance(v.get("content"), str):  # AddedToken serialisation
        return v["content"]
    return None


def cut_after_final(text: str, content: str) -> str:
    """transformers' continue_final_message: the rendered chat (no generation prompt) cut
    right after the final message's content, its end of turn dropped, so that the model
    continues that message. ChatTemplateError if the template does not show the content
    as written (it cannot be continued then)."""
    body = content.strip()
    at = text.rfind(body) if body else -1
    if at < 0:
        raise ChatTemplateError(
            "the final assistant message cannot be continued: it is empty, or the chat "
            "template does not show it as written"
        )
    whole = content.lstrip()  # its trailing whitespace too, where the template keeps it
    return text[: at + (len(whole) if text.startswith(whole, at) else len(body))]


class ChatTemplate:
    def __init__(self, source: str, special_tokens: dict[str, str]) -> None:
        env = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols]
        )
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        try:
            self.template = env.from_string(source)
        except jinja2.TemplateError as e:
            raise ValueError(f"chat template does not compile: {e}") from e
        self.special_tokens = special_tokens
        self.source = source

    @classmethod
    def from_model_dir(cls, model_dir: str | Path) -> ChatTemplate | None:
        """The template of tokenizer_config.json (or chat_template.jinja), or None."""
        model_dir = Path(model_dir)
        cfg: dict[str, Any] = {}
        path = model_dir / "tokenizer_config.json"
        if path.exists():
            try:
                cfg = json.loads(path.read_text())
            except ValueError as e:
                raise ValueError(f"{path} is not valid JSON: {e}") from e
        source = cfg.get("chat_template")
        if isinstance(source, list):  # named templates: use "default"
            named = {t.get("name"): t.get("template") for t in source if isinstance(t, dict)}
            source = named.get("default")
        jinja_file = model_dir / "chat_template.jinja"
        if not source and jinja_file.exists():
            source = jinja_file.read_text()
        if not isinstance(source, str) or not source:
            return None
        special = {k: s for k, v in cfg.items() if k.endswith("_token") and (s := _token_str(v))}
        return cls(source, special)

    def render(
        self, messages: list[dict[str, Any]], add_generation_prompt: bool = True, **extra: Any
    ) -> str:
        """`extra`: more template variables (`tools`, as apply_chat_template passes them)."""
        try:
            return self.template.render(
                {
                    **self.special_tokens,
                    **extra,  # (may shadow a special token's name; never the messages)
                    "messages": messages,
                    "add_generation_prompt": add_generation_prompt,
                }
            )
        except ChatTemplateError:
            raise
        except jinja2.TemplateError as e:
            raise ChatTemplateError(f"chat template failed: {e}") from e
        except (TypeError, KeyError, AttributeError, ValueError) as e:
            raise ChatTemplateError(f"chat template failed on these messages: {e}") from e
