"""Chat templates rendered like transformers' apply_chat_template: the default model's,
and a custom one exercising what transformers' Jinja environment adds; template errors
are 400s naming `messages`."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest

from common.messages import unpack_ids
from tests.tokenizer_worker.conftest import CONVERSATIONS, chat, hf_chat_ids, rejected
from tokenizer_worker.chat_template import ChatTemplate
from tokenizer_worker.tokenization import Tokenization

pytestmark = pytest.mark.timeout(120)

# Exercises what transformers' chat environment provides beyond plain Jinja: trim_blocks
# and lstrip_blocks (block tags on their own indented lines), loop controls, `tojson`
# (non-ASCII kept, dict key order kept, indent), raise_exception, and the special-token
# strings of tokenizer_config.json as variables.
CUSTOM_TEMPLATE = """{{ bos_token }}
{% for message in messages %}
    {% if message['role'] not in ['system', 'user', 'assistant'] %}
        {{ raise_exception('Conversation roles must be system/user/assistant, got ' + message['role']) }}
    {% endif %}
    {% if message['content'] == '<END>' %}
        {% break %}
    {% endif %}
    {% if message['content'] == '<SKIP>' %}
        {% continue %}
    {% endif %}
<|im_start|>{{ message['role'] }}
{{ message['content'] }}
{{ {'i': loop.index, 'role': message['role'], 'text': message['content']} | tojson }}
{{ [message['content'], loop.last] | tojson(indent=2) }}<|im_end|>
{% endfor %}
{{ messages | length | tojson }}
{% if add_generation_prompt %}
<|im_start|>assistant
{% endif %}
{{ eos_token }}"""

CUSTOM_CONVERSATIONS = {
    "plain": CONVERSATIONS["system+user"],
    "unicode": CONVERSATIONS["unicode"],
    "break": [
        {"role": "user", "content": "one"},
        {"role": "assistant", "content": "<END>"},
        {"role": "user", "content": "never rendered"},
    ],
    "continue": [{"role": "user", "content": "<SKIP>"}, {"role": "user", "content": "two"}],
}


def _copy_tokenizer_dir(
    src: Path, dst: Path, template: str | None, *, as_jinja: bool = False, **special: str
) -> Path:
    """A model dir with src's tokenizer and config, and `template` as its only chat template
    (in tokenizer_config.json, or in chat_template.jinja with as_jinja)."""
    dst.mkdir()
    for name in ("tokenizer.json", "config.json"):
        shutil.copy(src / name, dst / name)
    cfg = json.loads((src / "tokenizer_config.json").read_text())
    cfg.pop("chat_template", None)
    cfg.update(special)
    if template is not None and as_jinja:
        (dst / "chat_template.jinja").write_text(template)
    elif template is not None:
        cfg["chat_template"] = template
    (dst / "tokenizer_config.json").write_text(json.dumps(cfg))
    return dst


@pytest.fixture(scope="module")
def custom_dirs(default_model_dir, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("custom_template")
    special = {"bos_token": "<|endoftext|>", "eos_token": "<|im_end|>"}
    return {
        "config": _copy_tokenizer_dir(
            default_model_dir, root / "config", CUSTOM_TEMPLATE, **special
        ),
        "jinja": _copy_tokenizer_dir(
            default_model_dir, root / "jinja", CUSTOM_TEMPLATE, as_jinja=True, **special
        ),
    }


@pytest.mark.parametrize("name", list(CONVERSATIONS))
def test_chat_ids_equal_transformers(tok, hf_tok, name):
    messages = CONVERSATIONS[name]
    out = tok(chat(messages))
    ids = unpack_ids(out.prompt_token_ids)
    assert ids == hf_chat_ids(hf_tok, messages)
    # and the rendering is the template's, verbatim: special tokens are not re-added
    text = tok.chat_template.render(messages, add_generation_prompt=True)
    assert tok.tokenizer.decode(ids, skip_special_tokens=False) == text
    assert text.endswith("<|im_start|>assistant\n")


@pytest.mark.parametrize("where", ["config", "jinja"])
@pytest.mark.parametrize("name", list(CUSTOM_CONVERSATIONS))
def test_custom_template_equals_transformers(custom_dirs, where, name):
    from transformers import AutoTokenizer

    model_dir = custom_dirs[where]
    messages = CUSTOM_CONVERSATIONS[name]
    hf = AutoTokenizer.from_pretrained(model_dir)
    tok = Tokenization(model_dir)
    ids = unpack_ids(tok(chat(messages)).prompt_token_ids)
    assert ids == hf_chat_ids(hf, messages)
    text = tok.chat_template.render(messages, add_generation_prompt=True)
    assert text.startswith("<|endoftext|>\n<|im_start|>")  # bos_token from the config
    assert text.endswith("<|im_start|>assistant\n<|im_end|>")
    if name == "break":
        assert "never rendered" not in text and "one" in text
    if name == "continue":
        assert "<SKIP>" not in text and "two" in text
    if name == "unicode":
        assert '"text": "你好，世界！今天天气怎么样？"' in text  # tojson keeps non-ASCII


def test_custom_template_raise_exception_is_400(custom_dirs):
    from transformers import AutoTokenizer

    # (a "tool" message is rendered by tokenizer_worker.tool_prompt where the template has
    # no tool support, so the role this template refuses here is one nobody renders)
    messages = [{"role": "user", "content": "hi"}, {"role": "critic", "content": "42"}]
    hf = AutoTokenizer.from_pretrained(custom_dirs["config"])
    with pytest.raises(Exception, match="roles must be system/user/assistant"):
        hf.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    e = rejected(Tokenization(custom_dirs["config"]), chat(messages))
    assert e.param == "messages"
    assert "roles must be system/user/assistant, got critic" in e.message


def test_template_runtime_error_is_400(default_model_dir, tmp_path):
    """A template that fails on these messages (not via raise_exception) is a 400 too."""
    d = _copy_tokenizer_dir(default_model_dir, tmp_path / "m", "{{ messages[0]['content'] + 1 }}")
    e = rejected(Tokenization(d), chat([{"role": "user", "content": "x"}]))
    assert e.param == "messages"


def test_named_templates_use_default(default_model_dir, tmp_path):
    d = _copy_tokenizer_dir(default_model_dir, tmp_path / "m", None)
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    cfg["chat_template"] = [
        {"name": "tool_use", "template": "TOOLS"},
        {"name": "default", "template": "DEFAULT {{ messages | length }}"},
    ]
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    assert ChatTemplate.from_model_dir(d).render([{"role": "user", "content": "x"}]) == "DEFAULT 1"


@pytest.mark.parametrize("prefill", ["1, 2,", " {", "Sure: "])
def test_continue_final_message_equals_transformers(tok, hf_tok, prefill):
    """The prompt ends inside the final assistant message (Anthropic's prefill, vLLM's
    continue_final_message), token for token as transformers' apply_chat_template
    (continue_final_message=True) renders it."""
    messages = [
        {"role": "user", "content": "Count to 5"},
        {"role": "assistant", "content": prefill},
    ]
    req = dataclasses.replace(chat(messages), continue_final=True)
    ids = unpack_ids(tok(req).prompt_token_ids)
    want = hf_tok.apply_chat_template(messages, continue_final_message=True, tokenize=True)
    want = list(want if isinstance(want, list) else want["input_ids"])
    assert ids == want
    assert tok.tokenizer.decode(ids, skip_special_tokens=False).endswith(
        "<|im_start|>assistant\n" + prefill  # as written: this template keeps it whole
    )


def test_continue_final_message_needs_an_assistant_message_to_continue(tok):
    user_last = [{"role": "user", "content": "Hi"}]
    err = rejected(tok, dataclasses.replace(chat(user_last), continue_final=True))
    assert err.param == "messages.0" and "not an assistant message" in err.message
    blank = [*user_last, {"role": "assistant", "content": "  "}]
    err = rejected(tok, dataclasses.replace(chat(blank), continue_final=True))
    assert "cannot be continued" in err.message
