"""The happy paths: completions, chat and /generate, streamed and not, n > 1, logprobs, and
the official openai client against the real app (fake backend, see fake_backend.py)."""

from __future__ import annotations

import time

import openai
import pytest

from common.messages import unpack_ids
from tests.frontend.conftest import serve
from tests.frontend.sse import parse_sse

pytestmark = pytest.mark.timeout(30)


def _requests_for(served, response_id: str):
    with served.backend.lock:
        return sorted(
            (r for r in served.backend.requests if r.rid.startswith(response_id + "-")),
            key=lambda r: r.rid,
        )


def test_completion_non_streaming(served, http):
    r = http.post("/v1/completions", json={"model": served.config.model_name, "prompt": "Hi"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "text_completion" and body["id"].startswith("cmpl-")
    assert body["model"] == served.config.model_name and isinstance(body["created"], int)
    (choice,) = body["choices"]
    assert choice == {
        "index": 0,
        "text": "Hello world!",
        "logprobs": None,
        "finish_reason": "stop",
        "stop_reason": None,
    }
    assert body["usage"] == {
        "prompt_tokens": 5,
        "completion_tokens": 3,
        "total_tokens": 8,
        "prompt_tokens_details": {"cached_tokens": 0},
    }
    (req,) = _requests_for(served, body["id"])
    assert req.kind == "completion" and req.prompt == "Hi" and req.prompt_token_ids is None
    # unset: OpenAI's default for completions, capped by the room in the context
    assert req.params.max_tokens is None and req.params.max_tokens_cap == 16  # the default
    assert req.rid == body["id"] + "-0"


def test_completion_params_reach_the_tokenizer(served, http):
    r = http.post(
        "/v1/completions",
        json={
            "prompt": ["Hi"],
            "max_tokens": 2,
            "temperature": 0.5,
            "top_p": 0.9,
            "top_k": 5,
            "min_p": 0.1,
            "presence_penalty": 0.5,
            "frequency_penalty": -0.5,
            "repetition_penalty": 1.1,
            "seed": 3,
            "stop": "x",
            "stop_token_ids": [7],
            "ignore_eos": True,
            "min_tokens": 1,
            "skip_special_tokens": False,
            "include_stop_str_in_output": True,
            "user": "u",
            "logit_bias": {},
            "store": False,
        },
    )
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["finish_reason"] == "length"
    assert r.json()["choices"][0]["text"] == "Hello world"
    (req,) = _requests_for(served, r.json()["id"])
    p = req.params
    assert (p.max_tokens, p.temperature, p.top_p, p.top_k, p.min_p) == (
        2,
        0.5,
        0.9,
        5,
        0.1,
    )
    assert (p.presence_penalty, p.frequency_penalty, p.repetition_penalty) == (
        0.5,
        -0.5,
        1.1,
    )
    assert (p.seed, p.stop, p.stop_token_ids, p.ignore_eos) == (3, ["x"], [7], True)
    assert (p.min_tokens, p.skip_special_tokens, p.include_stop_str_in_output) == (
        1,
        False,
        True,
    )
    assert p.logprobs is None


def test_completion_token_id_prompt(served, http):
    r = http.post("/v1/completions", json={"prompt": [1, 2, 3, 4]})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["prompt_tokens"] == 4
    (req,) = _requests_for(served, r.json()["id"])
    assert req.prompt is None and unpack_ids(req.prompt_token_ids) == [1, 2, 3, 4]


def test_batched_prompts_are_indexed_prompt_by_prompt(served, http):
    r = http.post("/v1/completions", json={"prompt": ["a", "bc", "def"], "n": 2, "max_tokens": 2})
    assert r.status_code == 200, r.text
    body = r.json()
    assert [c["index"] for c in body["choices"]] == list(range(6))
    reqs = _requests_for(served, body["id"])
    by_index = {int(q.rid.split("-")[-1].split(".")[0]): q for q in reqs}
    assert [by_index[i].prompt for i in range(6)] == ["a", "a", "bc", "bc", "def", "def"]
    # each prompt counts once (the fake's prompts are 5 tokens), every choice's tokens
    assert body["usage"]["prompt_tokens"] == 15 and body["usage"]["completion_tokens"] == 12
    r = http.post("/v1/completions", json={"prompt": [[1, 2], [3, 4, 5]], "max_tokens": 1})
    assert r.json()["usage"]["prompt_tokens"] == 5
    reqs = sorted(_requests_for(served, r.json()["id"]), key=lambda q: q.rid)
    assert [unpack_ids(q.prompt_token_ids) for q in reqs] == [[1, 2], [3, 4, 5]]


@pytest.mark.parametrize(
    "prompt, param",
    [([], "prompt"), ([[1], []], "prompt.1"), (["a", [1]], "prompt"), ([[1], [-1]], "prompt.1")],
)
def test_bad_prompt_batches(http, prompt, param):
    r = http.post("/v1/completions", json={"prompt": prompt})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


def test_prompt_batch_limit():
    with serve(max_queued_requests=4) as s, s.client() as c:
        r = c.post("/v1/completions", json={"prompt": ["a", "b", "c"], "n": 2})
        assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"
        assert c.post("/v1/completions", json={"prompt": ["a", "b"], "n": 2}).status_code == 200


def test_echo_with_logprobs_and_max_tokens_0(served, http):
    """echo: the prompt's text first and, with logprobs, its tokens' logprobs (the first
    null); max_tokens 0 scores the prompt only (one token generated, dropped)."""
    body = {"prompt": [5, 6, 7], "echo": True, "logprobs": 1, "max_tokens": 0}
    r = http.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    (choice,) = r.json()["choices"]
    assert choice["text"] == "".join(chr(t) for t in (5, 6, 7))  # the fake's detokenize
    assert choice["logprobs"] == {
        "tokens": ["p0", "p1", "p2"],
        "token_logprobs": [None, -1.0, -2.0],
        "top_logprobs": [None, {"t0": -0.25}, {"t0": -0.25}],
        "text_offset": [0, 2, 4],
    }
    assert choice["finish_reason"] == "length"
    assert r.json()["usage"] == {
        "prompt_tokens": 3,
        "completion_tokens": 0,
        "total_tokens": 3,
        "prompt_tokens_details": {"cached_tokens": 0},
    }
    (req,) = _requests_for(served, r.json()["id"])
    assert req.params.max_tokens == 1 and req.params.prompt_logprobs == 1
    # echo with generation: the prompt, then the generated text and its logprobs
    body = {"prompt": "Hi", "echo": True, "logprobs": 0, "max_tokens": 2}
    choice = http.post("/v1/completions", json=body).json()["choices"][0]
    assert choice["text"] == "HiHello world"
    lp = choice["logprobs"]
    assert lp["tokens"] == ["p0", "p1", "p2", "p3", "p4", "token_id:11", "token_id:12"]
    assert lp["token_logprobs"][:2] == [None, -1.0] and lp["top_logprobs"][1] == {}
    assert lp["text_offset"][5:] == [2, 7]  # generated tokens: after the prompt's text
    # echo without logprobs asks the engine for none
    r = http.post("/v1/completions", json={"prompt": "Hi", "echo": True, "max_tokens": 1})
    assert r.json()["choices"][0]["text"] == "HiHello"
    (req,) = _requests_for(served, r.json()["id"])
    assert req.params.prompt_logprobs is None


def test_echo_streaming(served, http):
    body = {"prompt": ["Hi", "Yo"], "echo": True, "max_tokens": 2, "stream": True}
    with http.stream("POST", "/v1/completions", json=body) as r:
        events = parse_sse(r.read().decode())
    texts = {0: "", 1: ""}
    for e in events[:-1]:
        texts[e["choices"][0]["index"]] += e["choices"][0]["text"]
    assert texts == {0: "HiHello world", 1: "YoHello world"}


def test_completion_streaming_sse(served, http):
    body = {"prompt": "Hi", "stream": True, "stream_options": {"include_usage": True}}
    with http.stream("POST", "/v1/completions", json=body) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        events = parse_sse(r.read().decode())
    assert events[-1] == "[DONE]"
    usage_chunk = events[-2]
    assert usage_chunk["choices"] == [] and usage_chunk["usage"] == {
        "prompt_tokens": 5,
        "completion_tokens": 3,
        "total_tokens": 8,
        "prompt_tokens_details": {"cached_tokens": 0},
    }
    chunks = events[:-2]
    assert all(c["object"] == "text_completion" and c["id"] == chunks[0]["id"] for c in chunks)
    assert all("usage" in c and c["usage"] is None for c in chunks)  # as OpenAI: null till the end
    assert "".join(c["choices"][0]["text"] for c in chunks) == "Hello world!"
    assert [c["choices"][0]["finish_reason"] for c in chunks][-1] == "stop"
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1])


def test_continuous_usage_stats_put_usage_in_every_chunk(served, http):
    """vLLM's stream_options.continuous_usage_stats: each chunk carries its choice's usage
    so far (chat's role chunk: 0 completion tokens); the last chunk is the total."""
    opts = {"include_usage": True, "continuous_usage_stats": True}
    body = {"messages": [{"role": "user", "content": "Hi"}], "stream": True, "stream_options": opts}
    with http.stream("POST", "/v1/chat/completions", json=body) as r:
        events = parse_sse(r.read().decode())
    assert events[-1] == "[DONE]"
    usages = [e["usage"] for e in events[:-1]]
    assert [u["completion_tokens"] for u in usages] == [0, 1, 2, 3, 3]
    assert all(u["prompt_tokens"] == 5 for u in usages)
    assert all(u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"] for u in usages)
    body = {"prompt": "Hi", "stream": True, "stream_options": opts}
    with http.stream("POST", "/v1/completions", json=body) as r:
        events = parse_sse(r.read().decode())
    assert [e["usage"]["completion_tokens"] for e in events[:-1]] == [1, 2, 3, 3]
    # without include_usage it asks for nothing (as vLLM)
    body["stream_options"] = {"continuous_usage_stats": True}
    with http.stream("POST", "/v1/completions", json=body) as r:
        events = parse_sse(r.read().decode())
    assert all("usage" not in e for e in events[:-1])


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions", "/generate"])
def test_stream_options_need_stream(served, http, path):
    body = {"stream_options": {"include_usage": True}, "stream": False}
    body |= (
        {"messages": [{"role": "user", "content": "Hi"}]} if "chat" in path else {"prompt": "Hi"}
    )
    r = http.post(path, json=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "stream_options"
    assert http.post(path, json={**body, "stream": True}).status_code == 200


def test_streaming_without_usage_has_no_usage_chunk(served, http):
    with http.stream("POST", "/v1/completions", json={"prompt": "Hi", "stream": True}) as r:
        events = parse_sse(r.read().decode())
    assert events[-1] == "[DONE]" and all("usage" not in e for e in events[:-1])


def test_stage_timings_reach_only_the_client_that_asked(served, http):
    """The workers stamp every finished request (for /metrics); return_timings stays in the
    frontend and decides whether the client sees them."""
    t0 = time.time()
    asked = http.post("/v1/completions", json={"prompt": "Hi", "return_timings": True}).json()
    took_ms = (time.time() - t0) * 1e3
    timings = asked["usage"]["timings"]
    assert timings.keys() == {"queue_ms", "scheduler_queue_ms"}, timings
    assert timings["scheduler_queue_ms"] == 2.0  # the fake's stamps, 2 ms apart
    # from the arrival, which never left the frontend, to the fake's (wall-clock) stamp
    assert 0 <= timings["queue_ms"] <= took_ms
    plain = http.post("/v1/completions", json={"prompt": "Hi"}).json()
    assert "timings" not in plain["usage"]


def test_chat_non_streaming(served, http):
    r = http.post(
        "/v1/chat/completions",
        json={
            "model": served.config.model_name,
            "messages": [
                {"role": "system", "content": "Be brief."},
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "Hi"}, {"type": "text", "text": " there"}],
                },
            ],
        },
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")
    (choice,) = body["choices"]
    assert choice["message"] == {"role": "assistant", "content": "Hello world!"}
    assert choice["finish_reason"] == "stop"
    assert body["usage"]["total_tokens"] == 8
    (req,) = _requests_for(served, body["id"])
    assert req.kind == "chat" and req.prompt is None
    assert req.messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi there"},
    ]
    # unset, no cap: the room the prompt leaves, settled by the tokenizer
    assert req.params.max_tokens is None and req.params.max_tokens_cap is None


def test_chat_max_completion_tokens_wins(served, http):
    r = http.post(
        "/v1/chat/completions",
        json={
            "messages": [{"role": "user", "content": "Hi"}],
            "max_tokens": 50,
            "max_completion_tokens": 2,
        },
    )
    assert r.status_code == 200
    assert r.json()["choices"][0]["finish_reason"] == "length"
    (req,) = _requests_for(served, r.json()["id"])
    assert req.params.max_tokens == 2


def test_chat_streaming(served, http):
    body = {
        "messages": [{"role": "user", "content": "Hi"}],
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    with http.stream("POST", "/v1/chat/completions", json=body) as r:
        assert r.status_code == 200
        events = parse_sse(r.read().decode())
    assert events[-1] == "[DONE]" and events[-2]["usage"]["completion_tokens"] == 3
    chunks = events[:-2]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    assert text == "Hello world!"
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


def test_n2_fans_out_with_seeds(served, http):
    r = http.post("/v1/completions", json={"prompt": "Hi", "n": 2, "seed": 7})
    assert r.status_code == 200, r.text
    body = r.json()
    assert [c["index"] for c in body["choices"]] == [0, 1]
    assert all(c["text"] == "Hello world!" for c in body["choices"])
    assert body["usage"] == {
        "prompt_tokens": 5,
        "completion_tokens": 6,
        "total_tokens": 11,
        "prompt_tokens_details": {"cached_tokens": 0},
    }
    reqs = _requests_for(served, body["id"])
    assert [r.rid for r in reqs] == [body["id"] + "-0", body["id"] + "-1"]
    assert [r.params.seed for r in reqs] == [7, 8]
    assert served.backend.max_rids_per_msg >= 2  # one TextOutputs carried both


def test_n2_streaming_chat(served, http):
    body = {"messages": [{"role": "user", "content": "Hi"}], "stream": True, "n": 2}
    with http.stream("POST", "/v1/chat/completions", json=body) as r:
        events = parse_sse(r.read().decode())
    assert events[-1] == "[DONE]"
    for i in (0, 1):
        mine = [e["choices"][0] for e in events[:-1] if e["choices"][0]["index"] == i]
        assert mine[0]["delta"]["role"] == "assistant"
        assert "".join(c["delta"].get("content", "") for c in mine) == "Hello world!"
        assert mine[-1]["finish_reason"] == "stop"


def test_completion_logprobs(served, http):
    r = http.post("/v1/completions", json={"prompt": "Hi", "logprobs": 2, "max_tokens": 2})
    assert r.status_code == 200, r.text
    lp = r.json()["choices"][0]["logprobs"]
    assert lp["tokens"] == ["token_id:11", "token_id:12"]
    assert lp["token_logprobs"] == [-0.5, -0.5]
    assert lp["top_logprobs"][0] == {"token_id:100": -0.5, "token_id:101": -1.5}
    assert lp["text_offset"] == [0, 5]
    (req,) = _requests_for(served, r.json()["id"])
    assert req.params.logprobs == 2


def test_chat_logprobs(served, http):
    r = http.post(
        "/v1/chat/completions",
        json={
            "messages": [{"role": "user", "content": "Hi"}],
            "logprobs": True,
            "top_logprobs": 1,
            "max_tokens": 1,
        },
    )
    assert r.status_code == 200, r.text
    content = r.json()["choices"][0]["logprobs"]["content"]
    assert content == [
        {
            "token": "token_id:11",
            "logprob": -0.5,
            "bytes": None,
            "top_logprobs": [{"token": "token_id:100", "logprob": -0.5, "bytes": None}],
        }
    ]


def test_generate_streams_plain_text(served, http):
    with http.stream("POST", "/generate", json={"prompt": "Hi", "max_new_tokens": 3}) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/plain")
        assert r.read().decode() == "Hello world!"
    reqs = [q for q in served.backend.requests if q.rid.startswith("gen-")]
    assert reqs[-1].params.max_tokens == 3


def test_generate_non_streaming(served, http):
    r = http.post("/generate", json={"prompt": "Hi", "stream": False, "temperature": 0})
    assert r.status_code == 200, r.text
    assert r.json() == {
        "text": "Hello world!",
        "finish_reason": "stop",
        "usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8},
    }
    reqs = [q for q in served.backend.requests if q.rid.startswith("gen-")]
    assert reqs[-1].params.max_tokens is None and reqs[-1].params.max_tokens_cap == 64
    assert reqs[-1].params.temperature == 0


def test_cached_tokens_in_usage(served, http):
    """usage.prompt_tokens_details.cached_tokens: the prefix-cache hits the scheduler counted
    (the fake backend: a token prompt seen before hits its whole blocks but the last
    token), in completions and chat, whole and in the streamed usage chunk."""
    prompt = list(range(1000, 1011))  # 11 tokens: 2 whole blocks of 4 before the last
    first = http.post("/v1/completions", json={"prompt": prompt}).json()
    again = http.post("/v1/completions", json={"prompt": prompt}).json()
    assert first["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
    assert again["usage"]["prompt_tokens"] == 11
    assert again["usage"]["prompt_tokens_details"] == {"cached_tokens": 8}
    body = {"prompt": prompt, "stream": True, "stream_options": {"include_usage": True}}
    with http.stream("POST", "/v1/completions", json=body) as r:
        events = parse_sse(r.read().decode())
    assert events[-2]["usage"]["prompt_tokens_details"] == {"cached_tokens": 8}
    client = openai.OpenAI(base_url=served.url + "/v1", api_key="x", max_retries=0, timeout=10)
    c = client.completions.create(model=served.config.model_name, prompt=prompt)
    assert c.usage.prompt_tokens_details.cached_tokens == 8
    chat = client.chat.completions.create(
        model=served.config.model_name, messages=[{"role": "user", "content": "Hi"}]
    )
    assert chat.usage.prompt_tokens_details.cached_tokens == 0


def test_models(served, http):
    body = http.get("/v1/models").json()
    assert body["object"] == "list"
    assert [m["id"] for m in body["data"]] == [served.config.model_name]
    assert body["data"][0]["max_model_len"] == 2048
    assert http.get(f"/v1/models/{served.config.model_name}").status_code == 200
    assert http.get("/v1/models/nope").json()["error"]["code"] == "model_not_found"


def test_openai_client(served):
    client = openai.OpenAI(base_url=served.url + "/v1", api_key="x", max_retries=0, timeout=10)
    model = served.config.model_name
    c = client.completions.create(model=model, prompt="Hi", max_tokens=5)
    assert c.choices[0].text == "Hello world!" and c.usage.completion_tokens == 3
    parts = [
        ch.choices[0].text
        for ch in client.completions.create(model=model, prompt="Hi", stream=True)
        if ch.choices
    ]
    assert "".join(parts) == "Hello world!"
    chat = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hi"}])
    assert chat.choices[0].message.content == "Hello world!"
    assert chat.choices[0].finish_reason == "stop"
    stream = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Hi"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert (
        "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == "Hello world!"
    )
    assert chunks[-1].usage.total_tokens == 8
    assert [m.id for m in client.models.list()] == [model]
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="no-such-model", prompt="Hi")
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=model, messages=[{"role": "user", "content": "bad"}])
    assert e.value.body["param"] == "prompt"
