"""--reasoning-parser end to end: a tiny random Qwen 3 (the default model's tokenizer, so
`<think>` is ordinary text) whose output a regex forces into `<think>…</think>answer`,
served by launch.py with --reasoning-parser qwen3, read through the openai client."""

from __future__ import annotations

import re
from collections.abc import Iterator

import openai
import pytest

from tests.conftest import copy_tokenizer_files, tiny_config
from tests.e2e.conftest import Server, start_server

pytestmark = pytest.mark.timeout(120)

WORDS = "[a-z ]{1,20}"
EXTRA = {"structured_outputs": {"regex": f"<think>{WORDS}</think>{WORDS}"}}


@pytest.fixture(scope="module")
def thinking_server(tmp_path_factory, default_model_dir) -> Iterator[Server]:
    import torch
    import transformers

    out = tmp_path_factory.mktemp("tiny_qwen3")
    config = tiny_config(
        "Qwen3Config",
        vocab_size=49152,
        head_dim=16,
        initializer_range=0.02,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
    )
    torch.manual_seed(0)
    transformers.Qwen3ForCausalLM(config).save_pretrained(out)
    copy_tokenizer_files(default_model_dir, out)
    server = start_server("--model", str(out), "--reasoning-parser", "qwen3", workers=1)
    try:
        yield server
    finally:
        server.stop()


def test_reasoning_split_streamed_and_not(thinking_server: Server) -> None:
    client = openai.OpenAI(base_url=thinking_server.url + "/v1", api_key="x")
    model = client.models.list().data[0].id
    messages = [{"role": "user", "content": "Hi"}]
    resp = client.chat.completions.create(
        model=model, messages=messages, max_tokens=60, temperature=0, extra_body=EXTRA
    )
    message = resp.choices[0].message
    reasoning = (message.model_extra or {}).get("reasoning_content")
    assert resp.choices[0].finish_reason == "stop", message
    assert isinstance(reasoning, str) and re.fullmatch(WORDS, reasoning), message
    assert message.content is not None and re.fullmatch(WORDS, message.content), message
    assert "think" not in message.content
    assert resp.usage is not None and resp.usage.completion_tokens_details is not None
    assert (resp.usage.completion_tokens_details.reasoning_tokens or 0) > 0
    assert resp.usage.completion_tokens_details.reasoning_tokens < resp.usage.completion_tokens

    stream = client.chat.completions.create(
        model=model,
        messages=messages,
        max_tokens=60,
        temperature=0,
        extra_body=EXTRA,
        stream=True,
    )
    parts: dict[str, list[str]] = {"reasoning_content": [], "content": []}
    for chunk in stream:
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        parts["content"].append(delta.content or "")
        parts["reasoning_content"].append((delta.model_extra or {}).get("reasoning_content") or "")
    # greedy: the same split as the whole response, and no tag reached the client
    assert "".join(parts["reasoning_content"]) == reasoning
    assert "".join(parts["content"]) == message.content
