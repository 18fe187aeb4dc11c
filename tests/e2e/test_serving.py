"""End to end: real processes (launch.py), loopback HTTP, the official openai client: what
the server generates, whole and streamed, against the in-process engine."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import openai
import pytest

from common.sampling_params import SamplingParams
from tests.e2e.conftest import CHATS, chat_ids

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def offline_engine(default_model_dir):
    """The in-process engine on the same model, dtype and (default) weights as the server."""
    from common.config import CacheConfig, EngineConfig, ModelConfig
    from scheduler_worker.engine import LLMEngine

    return LLMEngine(
        EngineConfig(
            model=ModelConfig(model="smollm2", dtype="float32"), cache=CacheConfig(num_blocks=256)
        ),
        default_model_dir,
    )


@pytest.fixture(scope="module")
def offline_ids(offline_engine, tokenizer):
    """text -> the in-process engine's greedy token ids."""
    from common.sampling_params import SamplingParams

    engine = offline_engine

    def run(prompt: str, max_tokens: int) -> list[int]:
        ids = tokenizer(prompt)["input_ids"]
        return engine.generate([ids], SamplingParams(max_tokens=max_tokens, temperature=0))[0]

    return run


@pytest.fixture(scope="module")
def offline(offline_ids, tokenizer):
    """text -> the in-process engine's greedy text."""
    return lambda prompt, max_tokens: tokenizer.decode(
        offline_ids(prompt, max_tokens), skip_special_tokens=True
    )


def test_health_models_and_components(server):
    h = httpx.get(server.url + "/health", timeout=5).json()
    assert h["status"] == "ok"
    for path in ("/health", "/"):  # load balancers' HEAD probes
        head = httpx.head(server.url + path, timeout=5)
        assert head.status_code == 200 and head.content == b"", path
    assert h["components"]["tokenizer"]["workers"] == 2
    models = httpx.get(server.url + "/v1/models", timeout=5).json()
    assert models["data"][0]["id"] == "smollm2"
    assert models["data"][0]["max_model_len"] == 8192


def test_chat_greedy_equals_the_in_process_engine(server, client, tokenizer, offline_engine):
    """The server with default flags (on the CPU: the GGUF's own blocks) answers what the
    engine it wraps computes; the engine's own parity with transformers (--quantization
    none, float32) and with the dequantized float path is in tests/scheduler_worker."""
    n = 24
    prompts = [chat_ids(tokenizer, m) for m in CHATS]
    params = SamplingParams(max_tokens=n, temperature=0, ignore_eos=True)
    expected = [offline_engine.generate([p], params)[0] for p in prompts]
    for messages, prompt, want in zip(CHATS, prompts, expected):
        r = client.chat.completions.create(
            model="smollm2",
            messages=messages,
            max_tokens=n,
            temperature=0,
            extra_body={"ignore_eos": True},
        )
        assert r.usage.prompt_tokens == len(prompt)
        assert r.usage.completion_tokens == n
        assert r.choices[0].finish_reason == "length"
        assert r.choices[0].message.content == tokenizer.decode(want, skip_special_tokens=True)


def test_streaming_equals_non_streaming(client):
    kwargs = dict(model="smollm2", messages=CHATS[0], max_tokens=20, temperature=0)
    whole = client.chat.completions.create(**kwargs)
    chunks = list(
        client.chat.completions.create(
            **kwargs, stream=True, stream_options={"include_usage": True}
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    finals = [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ]
    assert finals == [whole.choices[0].finish_reason]
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_sse_wire_format_ends_with_done(server):
    body = {"prompt": "Once upon a time", "max_tokens": 8, "stream": True, "temperature": 0}
    r = httpx.post(server.url + "/v1/completions", json=body, timeout=60)
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/event-stream")
    events = r.text.strip().split("\n\n")
    assert events[-1] == "data: [DONE]"
    payloads = [json.loads(e[len("data: ") :]) for e in events[:-1]]
    assert payloads[-1]["choices"][0]["finish_reason"] == "length"


def test_64_concurrent_streams(server):
    n_streams, n_tokens = 64, 16

    async def one(aclient: openai.AsyncOpenAI, i: int) -> tuple[int, str, str | None]:
        stream = await aclient.completions.create(
            model="smollm2",
            prompt=f"Story number {i}: once upon a time",
            max_tokens=n_tokens,
            temperature=0.8,
            seed=i,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
        text, finish, usage = "", None, None
        async for chunk in stream:
            if chunk.choices:
                text += chunk.choices[0].text
                finish = chunk.choices[0].finish_reason or finish
            if chunk.usage:
                usage = chunk.usage.completion_tokens
        return usage, text, finish

    async def main():
        aclient = openai.AsyncOpenAI(
            base_url=server.url + "/v1",
            api_key="x",
            max_retries=0,
            timeout=120,
            http_client=httpx.AsyncClient(limits=httpx.Limits(max_connections=n_streams)),
        )
        async with aclient:
            return await asyncio.gather(*(one(aclient, i) for i in range(n_streams)))

    t0 = time.monotonic()
    results = asyncio.run(main())
    elapsed = time.monotonic() - t0
    assert len(results) == n_streams
    for usage, text, finish in results:
        assert usage == n_tokens and finish == "length" and text
    # seeds differ, so the streams are not copies of one another
    assert len({t for _, t, _ in results}) > n_streams // 2
    print(f"64 streams x {n_tokens} tokens in {elapsed:.1f} s")
    server.wait_idle()


def test_multibyte_text_never_breaks(server, client, offline):
    """Emoji and CJK arrive whole: no U+FFFD in any chunk; the stream reassembles to exactly
    the offline engine's text."""
    kwargs = dict(
        model="smollm2",
        temperature=0,
        max_tokens=40,
        prompt="中文：你好，世界！我们今天去北京。😀😀 更多的中文句子：",
    )
    whole = client.completions.create(**kwargs).choices[0].text
    chunks = [c.choices[0].text for c in client.completions.create(**kwargs, stream=True)]
    assert "".join(chunks) == whole == offline(kwargs["prompt"], kwargs["max_tokens"])
    assert "\ufffd" not in whole
    assert any(ord(ch) > 0x2E80 for ch in whole), whole  # the model answered in CJK/emoji
    assert all("\ufffd" not in c for c in chunks)


def test_stop_string_cuts_and_never_leaks(client, offline):
    kwargs = dict(model="smollm2", prompt="Count: one, two, three,", temperature=0, max_tokens=30)
    full = client.completions.create(**kwargs).choices[0].text
    assert full == offline(kwargs["prompt"], kwargs["max_tokens"])
    assert len(full) > 12, full
    stop = full[6:10]  # a string the greedy continuation is known to contain
    cut = full[: full.index(stop)]
    r = client.completions.create(**kwargs, stop=[stop])
    assert r.choices[0].text == cut
    assert r.choices[0].finish_reason == "stop"
    streamed = "".join(
        c.choices[0].text for c in client.completions.create(**kwargs, stop=[stop], stream=True)
    )
    assert streamed == cut and stop not in streamed


def test_stop_token_ends_the_text_before_it(server, tokenizer, offline_ids):
    """stop_token_ids: finish_reason "stop", stop_reason the id, and (as vLLM) the token's
    text left out unless include_stop_str_in_output; it still counts in usage."""
    body = {"prompt": "Count: one, two, three,", "temperature": 0, "max_tokens": 30}
    ids = offline_ids(body["prompt"], body["max_tokens"])
    stop = ids[4]
    n = ids.index(stop) + 1
    for include, text in (
        (False, tokenizer.decode(ids[: n - 1])),
        (True, tokenizer.decode(ids[:n])),
    ):
        r = httpx.post(
            server.url + "/v1/completions",
            timeout=60,
            json={**body, "stop_token_ids": [stop], "include_stop_str_in_output": include},
        ).json()
        choice = r["choices"][0]
        assert (choice["text"], choice["finish_reason"], choice["stop_reason"]) == (
            text,
            "stop",
            stop,
        )
        assert r["usage"]["completion_tokens"] == n


def test_generate_endpoint_streams_plain_text(server, client):
    r = httpx.post(
        server.url + "/generate",
        timeout=60,
        json={"prompt": "The sky is", "max_new_tokens": 12, "temperature": 0},
    )
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    same = client.completions.create(
        model="smollm2", prompt="The sky is", max_tokens=12, temperature=0
    )
    assert r.text == same.choices[0].text
