"""A chat request's chat_template_kwargs (and reasoning_effort's enable_thinking) reach
the chat template as variables, without shadowing the conversation."""

from __future__ import annotations

from tokenizer_worker.chat_template import ChatTemplate

SOURCE = (
    "{% for m in messages %}{{ m.content }}{% endfor %}"
    "{% if add_generation_prompt %}|{% endif %}"
    "{% if enable_thinking is defined and not enable_thinking %}<think></think>{% endif %}"
)


def test_extra_variables_reach_the_template() -> None:
    t = ChatTemplate(SOURCE, {"bos_token": "<s>"})
    messages = [{"role": "user", "content": "hi"}]
    assert t.render(messages) == "hi|"
    assert t.render(messages, enable_thinking=False) == "hi|<think></think>"
    assert t.render(messages, enable_thinking=True) == "hi|"
    # a variable named like a special token is the request's; no duplicate-argument error
    assert ChatTemplate("{{ bos_token }}", {"bos_token": "<s>"}).render([], bos_token="B") == "B"
