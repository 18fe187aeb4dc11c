"""/v1/messages end to end: the real server (launch.py, the default SmolLM2 model) driven by
the official `anthropic` SDK, as Claude Code and Anthropic-SDK agents drive it.

The named tool_choice is forced by a grammar (constrained decoding); that test skips on a
build without it. Generations are short (max_tokens 8-80) so the module stays quick.
"""

from __future__ import annotations

from dataclasses import fields

import anthropic
import httpx
import jsonschema
import pytest

from common.sampling_params import SamplingParams

pytestmark = pytest.mark.timeout(300)

HAS_STRUCTURED = any(f.name == "structured" for f in fields(SamplingParams))
MODEL = "smollm2"
ADD_SCHEMA = {
    "type": "object",
    "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
    "required": ["a", "b"],
    "additionalProperties": False,
}
ADD = {"name": "add", "description": "Add two integers", "input_schema": ADD_SCHEMA}
QUESTION = [{"role": "user", "content": "What is 2 plus 3?"}]
GREEDY = {"temperature": 0}  # the SDK no longer takes sampling arguments: sent as extra_body


@pytest.fixture(scope="module")
def client(server) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0, timeout=120)


def test_create(client):
    m = client.messages.create(
        model=MODEL, max_tokens=8, system="Answer briefly.", messages=QUESTION, extra_body=GREEDY
    )
    assert m.id.startswith("msg_") and m.role == "assistant" and m.model == MODEL
    assert m.content and m.content[0].type == "text" and m.content[0].text
    assert m.stop_reason in ("end_turn", "max_tokens")
    assert 0 < m.usage.output_tokens <= 8
    assert m.usage.input_tokens + (m.usage.cache_read_input_tokens or 0) > 10


def test_stream_text_and_final_message(client):
    with client.messages.stream(
        model=MODEL, max_tokens=8, messages=QUESTION, extra_body=GREEDY
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text and final.content[0].type == "text" and final.content[0].text == text
    assert final.stop_reason in ("end_turn", "max_tokens")
    assert 0 < final.usage.output_tokens <= 8


def test_stop_sequence(client):
    """Greedy text cut by a stop sequence taken from its own uncut answer."""
    full = client.messages.create(model=MODEL, max_tokens=12, messages=QUESTION, extra_body=GREEDY)
    text = full.content[0].text
    words = text.split()
    assert len(words) >= 3, text
    stop = words[2]
    m = client.messages.create(
        model=MODEL, max_tokens=12, messages=QUESTION, extra_body=GREEDY, stop_sequences=[stop]
    )
    assert (m.stop_reason, m.stop_sequence) == ("stop_sequence", stop)
    assert stop not in m.content[0].text and text.startswith(m.content[0].text.rstrip())


@pytest.mark.skipif(not HAS_STRUCTURED, reason="no constrained decoding in this build")
def test_tool_use_round_trip(client):
    m = client.messages.create(
        model=MODEL,
        max_tokens=80,
        messages=QUESTION,
        tools=[ADD],
        tool_choice={"type": "tool", "name": "add"},
        extra_body=GREEDY,
    )
    assert m.stop_reason == "tool_use", m
    uses = [b for b in m.content if b.type == "tool_use"]
    assert uses and uses[0].name == "add" and uses[0].id.startswith("toolu_")
    jsonschema.validate(uses[0].input, ADD_SCHEMA)
    result = uses[0].input["a"] + uses[0].input["b"]
    follow = client.messages.create(
        model=MODEL,
        max_tokens=16,
        tools=[ADD],
        extra_body=GREEDY,
        messages=[
            *QUESTION,
            {"role": "assistant", "content": [b.model_dump() for b in m.content]},
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": uses[0].id, "content": str(result)}
                ],
            },
        ],
    )
    assert follow.stop_reason in ("end_turn", "max_tokens", "tool_use")
    assert follow.content and follow.usage.output_tokens > 0


def test_count_tokens_matches_the_prompt(client, server):
    counted = client.messages.count_tokens(model=MODEL, system="Be brief.", messages=QUESTION)
    tokenized = httpx.post(
        server.url + "/tokenize",
        json={"messages": [{"role": "system", "content": "Be brief."}, *QUESTION]},
        timeout=30,
    ).json()
    assert counted.input_tokens == tokenized["count"] > 0
    m = client.messages.create(
        model=MODEL, max_tokens=1, system="Be brief.", messages=QUESTION, extra_body=GREEDY
    )
    assert m.usage.input_tokens + (m.usage.cache_read_input_tokens or 0) == counted.input_tokens


def test_errors(client):
    with pytest.raises(anthropic.BadRequestError) as e:  # the SDK itself insists on max_tokens
        client.post(
            "/v1/messages",
            cast_to=anthropic.types.Message,
            body={"model": MODEL, "messages": QUESTION},
        )
    assert e.value.status_code == 400
    assert e.value.body["error"]["type"] == "invalid_request_error"
    assert "max_tokens" in e.value.body["error"]["message"]
    with pytest.raises(anthropic.NotFoundError):
        client.messages.create(model="claude-unknown", max_tokens=4, messages=QUESTION)


def test_an_assistant_prefill_is_continued(client, server):
    """A final assistant message is the start of the reply (Anthropic's prefill): the
    prompt ends inside it, no new turn, so the reply is what a completion of that exact
    prompt gives; OpenAI's chat takes vLLM's continue_final_message for the same."""
    messages = [
        {"role": "user", "content": "Count to 5"},
        {"role": "assistant", "content": "1, 2,"},
    ]
    tok = httpx.post(
        server.url + "/tokenize",
        json={"messages": messages, "continue_final_message": True},
        timeout=30,
    ).json()
    plain = httpx.post(server.url + "/tokenize", json={"messages": messages}, timeout=30).json()
    assert tok["count"] < plain["count"]  # no end of turn, no new assistant turn
    m = client.messages.create(model=MODEL, max_tokens=8, messages=messages, extra_body=GREEDY)
    assert m.usage.input_tokens + (m.usage.cache_read_input_tokens or 0) == tok["count"]
    counted = client.messages.count_tokens(model=MODEL, messages=messages)
    assert counted.input_tokens == tok["count"]
    completion = httpx.post(
        server.url + "/v1/completions",
        json={"model": MODEL, "prompt": tok["tokens"], "max_tokens": 8, "temperature": 0},
        timeout=60,
    ).json()
    assert m.content[0].text == completion["choices"][0]["text"]
    chat = httpx.post(
        server.url + "/v1/chat/completions",
        json={
            "model": MODEL,
            "messages": messages,
            "max_tokens": 8,
            "temperature": 0,
            "continue_final_message": True,
        },
        timeout=60,
    ).json()
    assert chat["choices"][0]["message"]["content"] == completion["choices"][0]["text"]
