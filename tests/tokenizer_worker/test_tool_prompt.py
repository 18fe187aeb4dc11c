"""Chat prompts with tools (tokenizer_worker.tool_prompt): a template that handles tools
renders them as transformers' apply_chat_template(tools=...) does; a template that does
not (the default SmolLM2's) gets the documented tool-use system prompt, and the history's
calls are written in the format the parser reads back."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from common.tool_formats import FORMATS, tool_format
from tests.tokenizer_worker.conftest import hf_chat_ids
from tokenizer_worker.chat_template import ChatTemplate
from tokenizer_worker.tokenization import Tokenization
from tokenizer_worker.tool_prompt import (
    fallback_messages,
    family_tool_format,
    template_handles_tools,
)

pytestmark = pytest.mark.timeout(120)

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]
CALL = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
}
HISTORY = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": "", "tool_calls": [CALL]},
    {"role": "tool", "content": '{"temp": 18}', "tool_call_id": "call_1", "name": "get_weather"},
]

# A ChatML template that handles tools the way Qwen 2.5's does (written for this test):
# the tools listed in the system turn, calls as <tool_call> JSON, results as
# <tool_response> blocks inside a user turn.
TOOLS_TEMPLATE = """{%- if tools %}<|im_start|>system
{% if messages[0]['role'] == 'system' %}{{ messages[0]['content'] }}
{% endif %}# Tools
<tools>
{%- for tool in tools %}
{{ tool | tojson }}
{%- endfor %}
</tools><|im_end|>
{% elif messages[0]['role'] == 'system' %}<|im_start|>system
{{ messages[0]['content'] }}<|im_end|>
{% endif %}
{%- for message in messages %}
{%- if message.role == 'user' or (message.role == 'assistant' and not message.tool_calls) %}<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% elif message.role == 'assistant' %}<|im_start|>assistant
{{ message.content }}
{%- for tc in message.tool_calls %}
<tool_call>
{"name": "{{ tc.function.name }}", "arguments": {{ tc.function.arguments | tojson }}}
</tool_call>
{%- endfor %}<|im_end|>
{% elif message.role == 'tool' %}<|im_start|>user
<tool_response>
{{ message.content }}
</tool_response><|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""


@pytest.fixture(scope="module")
def tools_dir(default_model_dir, tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("tools_template")
    for name in ("tokenizer.json", "config.json"):
        shutil.copy(default_model_dir / name, d / name)
    cfg = json.loads((default_model_dir / "tokenizer_config.json").read_text())
    cfg["chat_template"] = TOOLS_TEMPLATE
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    return d


def test_template_with_tools_renders_as_transformers(tools_dir):
    import transformers

    hf_tok = transformers.AutoTokenizer.from_pretrained(tools_dir)
    out = hf_tok.apply_chat_template(HISTORY, tools=TOOLS, add_generation_prompt=True)
    want = list(out if isinstance(out, list) else out["input_ids"])
    tok = Tokenization(tools_dir)
    assert template_handles_tools(tok.chat_template)
    assert tok.chat_ids(HISTORY, tools=TOOLS) == want
    text = tok.tokenizer.decode(want, skip_special_tokens=False)
    assert '"name": "get_weather"' in text and "<tool_response>" in text


def test_default_model_gets_the_tool_prompt(default_model_dir):
    """SmolLM2's template knows nothing of tools: the system prompt lists them in the
    Hermes format, the call and its result are rewritten as text; the prompt is what
    transformers renders for the rewritten conversation."""
    import transformers

    tok = Tokenization(default_model_dir)
    assert not template_handles_tools(tok.chat_template)
    assert tok.tool_format.name == "hermes"
    rewritten = fallback_messages(HISTORY, TOOLS, tool_format("hermes"))
    assert [m["role"] for m in rewritten] == ["system", "user", "assistant", "user"]
    system = rewritten[0]["content"]
    assert system.startswith("Be brief.\n\n# Tools")
    assert json.dumps(TOOLS[0], ensure_ascii=False) in system
    assert rewritten[3]["content"] == '<tool_response>\n{"temp": 18}\n</tool_response>'
    parsed = tool_format("hermes").parse(rewritten[2]["content"])
    assert [(c.name, json.loads(c.arguments)) for c in parsed.calls] == [
        ("get_weather", {"city": "Paris"})
    ]
    hf_tok = transformers.AutoTokenizer.from_pretrained(default_model_dir)
    assert tok.chat_ids(HISTORY, tools=TOOLS) == hf_chat_ids(hf_tok, rewritten)


def test_no_system_message_gets_one_and_tool_results_are_joined():
    msgs = [
        {"role": "user", "content": "x"},
        {"role": "assistant", "content": "Checking.", "tool_calls": [CALL, CALL]},
        {"role": "tool", "content": "a", "tool_call_id": "1"},
        {"role": "tool", "content": "b", "tool_call_id": "2"},
    ]
    out = fallback_messages(msgs, TOOLS, tool_format("hermes"))
    assert out[0]["role"] == "system" and out[1] == {"role": "user", "content": "x"}
    assert out[2]["content"].startswith("Checking.\n<tool_call>")
    assert len(tool_format("hermes").parse(out[2]["content"]).calls) == 2
    assert out[3]["content"] == (
        "<tool_response>\na\n</tool_response>\n<tool_response>\nb\n</tool_response>"
    )
    assert len(out) == 4


def test_history_without_tools_is_rewritten_without_the_tool_prompt(default_model_dir):
    """A request without tools whose history holds a call and its result: the traces are
    rendered as with tools (not dropped by a template that ignores tool_calls), with no
    tool instructions."""
    tok = Tokenization(default_model_dir)
    rewritten = fallback_messages(HISTORY, [], tool_format("hermes"))
    assert rewritten[0] == HISTORY[0]  # the system message untouched
    assert "<tool_call>" in rewritten[2]["content"]
    text = tok.tokenizer.decode(tok.chat_ids(HISTORY), skip_special_tokens=False)
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}' in text
    assert "<tool_response>" in text and "# Tools" not in text


@pytest.mark.parametrize("parser", sorted(FORMATS))
def test_history_calls_are_written_as_the_parser_reads_them(parser):
    calls = [
        CALL,
        {
            "type": "function",
            "function": {"name": "add", "arguments": '{"a": 1, "b": [true, null]}'},
        },
    ]
    fmt = tool_format(parser)
    parsed = fmt.parse(fmt.write_calls(calls))
    assert [(c.name, json.loads(c.arguments)) for c in parsed.calls] == [
        ("get_weather", {"city": "Paris"}),
        ("add", {"a": 1, "b": [True, None]}),
    ]


@pytest.mark.parametrize(
    "hf, template, parser",
    [
        ({"model_type": "llama"}, "{{ messages }}", "hermes"),  # SmolLM2
        ({"model_type": "llama"}, "{{ '<|python_tag|>' }}", "llama3_json"),  # Llama 3.1
        ({"model_type": "qwen2"}, "{{ tools }}", "hermes"),
        ({"model_type": "mistral"}, "x", "mistral"),
        ({"architectures": ["MistralForCausalLM"], "model_type": "x"}, None, "mistral"),
        ({"model_type": "llama4"}, "x", "hermes"),  # no family: the default
        ({"model_type": "gpt2"}, None, "hermes"),
    ],
)
def test_format_per_family(hf, template, parser):
    t = ChatTemplate(template, {}) if template is not None else None
    assert family_tool_format(hf, t).name == parser
