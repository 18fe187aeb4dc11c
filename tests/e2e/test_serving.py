"""End to end: real processes (launch.py), loopback HTTP, the official openai client."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import openai
import pytest

from common.sampling_params import SamplingParams

pytestmark = pytest.mark.timeout(300)

CHATS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Name three primary colors."},
    ],
]


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def tokenizer(default_model_dir):
    import transformers

    return transformers.AutoTokenizer.from_pretrained(default_model_dir)


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


def chat_ids(tokenizer, messages) -> list[int]:
    out = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return list(out["input_ids"] if hasattr(out, "keys") else out)


def test_health_models_and_components(server):
    h = httpx.get(server.url + "/health", timeout=5).json()
    assert h["status"] == "ok"
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


def test_client_disconnect_frees_kv(server):
    body = {
        "prompt": "Write a very long essay.",
        "max_tokens": 4000,
        "stream": True,
        "ignore_eos": True,
    }
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=60) as r:
        assert r.status_code == 200
        lines = r.iter_lines()
        got = [next(lines) for _ in range(6)]
        assert any(x.startswith("data: ") for x in got)
        running = server.metrics()["zeroserve:num_requests_in_flight"]
        assert running >= 1
    # the stream was cut: the request is aborted and its blocks come back
    m = server.wait_idle(timeout_s=10)
    assert m['zeroserve:request_success_total{finished_reason="abort"}'] >= 1


def test_non_streaming_disconnect_frees_kv(server):
    body = {"prompt": "Write a very long essay.", "max_tokens": 4000, "ignore_eos": True}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server.url + "/v1/completions", json=body, timeout=1.5)
    server.wait_idle(timeout_s=10)


@pytest.mark.parametrize(
    "body,status,param,words",
    [
        ({"prompt": "hi " * 9000, "max_tokens": 4}, 400, "prompt", ["8192"]),
        ({"prompt": "hi", "max_tokens": 8192}, 400, "max_tokens", ["8192", "8193"]),
        ({"prompt": "hi", "temperature": -1}, 400, "temperature", ["temperature"]),
        ({"prompt": "hi", "top_p": 0}, 400, "top_p", ["top_p"]),
        ({"prompt": "hi", "model": "gpt-9"}, 404, "model", ["gpt-9"]),
        ({"prompt": [999999]}, 400, "prompt", ["vocabulary"]),
        ({"prompt": ""}, 400, "prompt", ["empty"]),
    ],
)
def test_errors_are_openai_json(server, body, status, param, words):
    r = httpx.post(server.url + "/v1/completions", json=body, timeout=30)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["param"] == param, err
    assert all(w in err["message"] for w in words), err["message"]
    assert err["type"]


def test_errors_when_streaming_are_http_errors(server):
    body = {"prompt": "hi " * 9000, "max_tokens": 4, "stream": True}
    r = httpx.post(server.url + "/v1/completions", json=body, timeout=30)
    assert r.status_code == 400 and "8192" in r.json()["error"]["message"]


def test_malformed_json_and_wrong_shape(server):
    r = httpx.post(
        server.url + "/v1/chat/completions",
        content=b"{not json",
        timeout=10,
        headers={"content-type": "application/json"},
    )
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    r = httpx.post(server.url + "/v1/chat/completions", json={"messages": "hello"}, timeout=10)
    assert r.status_code == 400 and "error" in r.json()


def test_openai_client_sees_errors(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="smollm2", prompt="hi", max_tokens=10, temperature=-2)
    assert "temperature" in str(e.value)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=CHATS[0])


def test_bad_requests_disturb_nothing(server, client):
    """A stream keeps going, token for token, while bad requests are thrown at the server."""
    kwargs = dict(
        model="smollm2",
        prompt="Tell me about the sea.",
        temperature=0,
        max_tokens=48,
        extra_body={"ignore_eos": True},
    )
    alone = client.completions.create(**kwargs).choices[0].text
    stream = client.completions.create(**kwargs, stream=True)
    bad = [
        {"prompt": "hi", "temperature": "hot"},
        {"prompt": "hi " * 9000},
        {"prompt": [10**12]},
        {"messages": [{"role": "user"}]},
    ]
    text = ""
    for i, chunk in enumerate(stream):
        text += chunk.choices[0].text
        if i < len(bad):
            r = httpx.post(server.url + "/v1/completions", json=bad[i], timeout=30)
            assert 400 <= r.status_code < 500, r.text
    assert text == alone
    assert httpx.get(server.url + "/health", timeout=5).status_code == 200


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


def test_metrics_count_tokens(server, client):
    before = server.metrics()
    client.completions.create(
        model="smollm2", prompt="Hello there", max_tokens=5, extra_body={"ignore_eos": True}
    )
    after = server.metrics()
    gen = "zeroserve:generation_tokens_total"
    assert after[gen] - before[gen] == 5
    assert (
        after["zeroserve:time_to_first_token_seconds_count"]
        > before["zeroserve:time_to_first_token_seconds_count"]
    )
    assert after["zeroserve:kv_cache_total_blocks"] == 1024


def test_cached_tokens_in_usage(client):
    """usage.prompt_tokens_details.cached_tokens: the same long prompt twice, the second
    finds its whole blocks (16 tokens each) in the prefix cache; streamed usage too."""
    prompt = f"Cache check {time.time_ns()}: " + "the quick brown fox jumps over the lazy dog " * 12
    kwargs = {"model": "smollm2", "prompt": prompt, "max_tokens": 2, "temperature": 0}
    first = client.completions.create(**kwargs).usage
    again = client.completions.create(**kwargs).usage
    assert first.prompt_tokens_details.cached_tokens == 0
    cached = again.prompt_tokens_details.cached_tokens
    assert 0 < cached < again.prompt_tokens and cached % 16 == 0, again
    chunks = list(
        client.completions.create(**kwargs, stream=True, stream_options={"include_usage": True})
    )
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens == cached
    messages = [{"role": "user", "content": prompt}]
    chat = [
        client.chat.completions.create(model="smollm2", messages=messages, max_tokens=2).usage
        for _ in range(2)
    ]
    # the chat template's system prompt comes first: earlier chats cached its blocks
    hits = [u.prompt_tokens_details.cached_tokens for u in chat]
    assert hits[1] > hits[0] and hits[1] % 16 == 0, hits


def test_stage_timings_in_usage_and_metrics(server):
    before = server.metrics()
    body = {"prompt": "Timing test", "max_tokens": 6, "ignore_eos": True, "return_timings": True}
    r = httpx.post(server.url + "/v1/completions", json=body, timeout=30).json()
    t = r["usage"]["timings"]
    # a stage whose stamps are missing or out of order is left out (stage_durations), so
    # every stage must be there; the ones that run the model take time
    assert set(t) == {
        "tokenize_ms",
        "queue_ms",
        "scheduler_queue_ms",
        "prefill_ms",
        "decode_ms",
        "detok_ms",
        "e2e_ms",
    }, t
    assert t["prefill_ms"] > 0 and t["decode_ms"] > 0, t  # a forward pass, five decode steps
    assert t["queue_ms"] >= t["tokenize_ms"]  # queue time counts from the HTTP arrival
    assert t["queue_ms"] >= t["scheduler_queue_ms"]  # ... the scheduler's from its receipt
    # consecutive stages: arrival -> scheduled -> first token -> finished -> sent (1 ms
    # for the scheduler's monotonic stamps turned into wall-clock ones, and rounding)
    assert t["e2e_ms"] >= t["queue_ms"] + t["prefill_ms"] + t["decode_ms"] - 1.0, t
    plain = httpx.post(
        server.url + "/v1/completions", timeout=30, json={"prompt": "Timing test", "max_tokens": 2}
    ).json()
    assert "timings" not in plain["usage"]  # only when asked
    # the busy split arrives with the scheduler's heartbeats (every second)
    busy_forward = 'zeroserve:scheduler_busy_seconds_total{part="forward"}'
    deadline = time.monotonic() + 10
    while (after := server.metrics()).get(busy_forward, 0) <= before.get(busy_forward, 0):
        assert time.monotonic() < deadline, "no heartbeat brought the busy split"
        time.sleep(0.1)
    for name in (
        "request_tokenize_time_seconds",
        "request_queue_time_seconds",
        "request_prefill_time_seconds",
        "request_decode_time_seconds",
        "request_detokenize_time_seconds",
    ):  # every request feeds the histograms
        key = f"zeroserve:{name}_count"
        assert after[key] - before.get(key, 0) == 2, key
    forward = after[busy_forward]
    busy = sum(
        v for k, v in after.items() if k.startswith("zeroserve:scheduler_busy_seconds_total")
    )
    assert 0 < forward < busy  # sample, schedule and ipc take time too


def test_tokenize_detokenize_round_trip(server, tokenizer):
    """The tokenizer pool answers /tokenize and /detokenize with the default model's
    tokenizer, as transformers does."""
    text = "Evaluation harnesses count tokens: café, 你好, 🎉."
    r = httpx.post(server.url + "/tokenize", json={"prompt": text}, timeout=30)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["tokens"] == tokenizer(text)["input_ids"] and body["count"] == len(body["tokens"])
    assert body["max_model_len"] > 0
    back = httpx.post(server.url + "/detokenize", json={"tokens": body["tokens"]}, timeout=30)
    assert back.json() == {"prompt": text}
    messages = CHATS[1]
    chat = httpx.post(server.url + "/tokenize", json={"messages": messages}, timeout=30).json()
    assert chat["tokens"] == chat_ids(tokenizer, messages)
    bad = httpx.post(server.url + "/detokenize", json={"tokens": [len(tokenizer)]}, timeout=30)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "tokens"
    info = httpx.get(server.url + "/tokenizer_info", timeout=30).json()
    assert info["eos_token"] == tokenizer.eos_token and info["chat_template"]


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
