"""End to end: sampling fields through the server: n choices, seeds, logprobs and
logit_bias."""

from __future__ import annotations

import httpx
import pytest

from tests.e2e.conftest import CHATS

pytestmark = pytest.mark.timeout(300)


def test_n_choices_and_logprobs(client):
    r = client.completions.create(
        model="smollm2",
        prompt="Pick a fruit:",
        max_tokens=6,
        n=3,
        temperature=1.0,
        seed=7,
        logprobs=2,
        extra_body={"ignore_eos": True},
    )
    assert sorted(c.index for c in r.choices) == [0, 1, 2]
    assert r.usage.completion_tokens == 18
    for c in r.choices:
        lp = c.logprobs
        assert len(lp.tokens) == len(lp.token_logprobs) == 6
        assert all(v <= 0 for v in lp.token_logprobs)
        assert all(len(top) <= 2 for top in lp.top_logprobs)
        assert "".join(lp.tokens) == c.text  # the tokens by their strings, as OpenAI
    chat = client.chat.completions.create(
        model="smollm2",
        messages=CHATS[0],
        max_tokens=6,
        temperature=0,
        logprobs=True,
        top_logprobs=3,
        extra_body={"ignore_eos": True},
    )
    content = chat.choices[0].logprobs.content
    assert "".join(t.token for t in content) == chat.choices[0].message.content
    for t in content:
        assert t.bytes is None or bytes(t.bytes).decode() == t.token
        assert len(t.top_logprobs) == 3 and t.top_logprobs[0].token == t.token  # greedy
    again = client.completions.create(
        model="smollm2",
        prompt="Pick a fruit:",
        max_tokens=6,
        n=3,
        temperature=1.0,
        seed=7,
        extra_body={"ignore_eos": True},
    )
    assert [c.text for c in again.choices] == [c.text for c in r.choices]  # seeded


def test_logit_bias_bans_and_forces_tokens(server, client, tokenizer):
    """logit_bias at temperature 0: -100 on the greedy first token makes another one
    first (whose reported logprobs are still the model's own: the banned token on top);
    +100 on a token makes the output that token over and over, sampled rows too; an id
    past the vocabulary is a 400 naming logit_bias."""
    prompt = "The capital of France is"
    body = {"model": "smollm2", "prompt": prompt, "temperature": 0, "max_tokens": 1}
    first = httpx.post(server.url + "/v1/completions", json=body, timeout=60).json()
    text = first["choices"][0]["text"]
    (banned,) = tokenizer.encode(text, add_special_tokens=False)  # one token, as it came
    r = httpx.post(
        server.url + "/v1/completions",
        json={**body, "logit_bias": {str(banned): -100}, "logprobs": 1},
        timeout=60,
    ).json()
    choice = r["choices"][0]
    assert choice["text"] != text, r
    assert list(choice["logprobs"]["top_logprobs"][0]) == [text]  # raw: the banned one tops
    forced = tokenizer.encode(" banana", add_special_tokens=False)[0]
    word = tokenizer.decode([forced])
    for temperature in (0, 1.0):
        out = client.completions.create(
            model="smollm2",
            prompt=prompt,
            max_tokens=3,
            temperature=temperature,
            logit_bias={str(forced): 100},
        )
        assert out.choices[0].text == word * 3 and out.usage.completion_tokens == 3
    chat = client.chat.completions.create(
        model="smollm2",
        messages=CHATS[0],
        max_tokens=3,
        temperature=0,
        logit_bias={str(forced): 100},
    )
    assert chat.choices[0].message.content == word * 3
    vocab = len(tokenizer)
    r = httpx.post(
        server.url + "/v1/chat/completions",
        json={"messages": CHATS[0], "max_tokens": 2, "logit_bias": {str(vocab + 7): 5}},
        timeout=60,
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "logit_bias", r.text


def test_min_tokens_holds_back_stop_strings_too(server):
    """As vLLM: before min_tokens tokens no stop string ends a request (only EOS and stop
    ids are masked in the sampler; the stop strings are the detokenizer's)."""
    body = {"model": "smollm2", "prompt": "1, 2, 3, 4, 5,", "stop": [","], "temperature": 0}
    url = server.url + "/v1/completions"
    free = httpx.post(url, json={**body, "max_tokens": 16}, timeout=60).json()
    held = httpx.post(url, json={**body, "max_tokens": 16, "min_tokens": 6}, timeout=60).json()
    assert free["choices"][0]["finish_reason"] == "stop"
    assert free["usage"]["completion_tokens"] < 6  # the first "," stops it early
    assert held["usage"]["completion_tokens"] >= 6, held
    assert held["choices"][0]["text"].startswith(free["choices"][0]["text"] + ",")
