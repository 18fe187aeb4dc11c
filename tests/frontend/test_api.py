"""The happy paths of completions and /generate: prompts (text, token ids, batches), echo,
n > 1, logprobs and /v1/models against the real app (fake backend, see fake_backend.py)."""

from __future__ import annotations

import pytest

from common.messages import unpack_ids
from tests.frontend.conftest import requests_for, serve
from tests.frontend.sse import parse_sse

pytestmark = pytest.mark.timeout(30)


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
    (req,) = requests_for(served, body["id"])
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
    (req,) = requests_for(served, r.json()["id"])
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
    (req,) = requests_for(served, r.json()["id"])
    assert req.prompt is None and unpack_ids(req.prompt_token_ids) == [1, 2, 3, 4]


def test_batched_prompts_are_indexed_prompt_by_prompt(served, http):
    r = http.post("/v1/completions", json={"prompt": ["a", "bc", "def"], "n": 2, "max_tokens": 2})
    assert r.status_code == 200, r.text
    body = r.json()
    assert [c["index"] for c in body["choices"]] == list(range(6))
    reqs = requests_for(served, body["id"])
    by_index = {int(q.rid.split("-")[-1].split(".")[0]): q for q in reqs}
    assert [by_index[i].prompt for i in range(6)] == ["a", "a", "bc", "bc", "def", "def"]
    # each prompt counts once (the fake's prompts are 5 tokens), every choice's tokens
    assert body["usage"]["prompt_tokens"] == 15 and body["usage"]["completion_tokens"] == 12
    r = http.post("/v1/completions", json={"prompt": [[1, 2], [3, 4, 5]], "max_tokens": 1})
    assert r.json()["usage"]["prompt_tokens"] == 5
    reqs = sorted(requests_for(served, r.json()["id"]), key=lambda q: q.rid)
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
    (req,) = requests_for(served, r.json()["id"])
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
    (req,) = requests_for(served, r.json()["id"])
    assert req.params.prompt_logprobs is None


def test_echo_streaming(served, http):
    body = {"prompt": ["Hi", "Yo"], "echo": True, "max_tokens": 2, "stream": True}
    with http.stream("POST", "/v1/completions", json=body) as r:
        events = parse_sse(r.read().decode())
    texts = {0: "", 1: ""}
    for e in events[:-1]:
        texts[e["choices"][0]["index"]] += e["choices"][0]["text"]
    assert texts == {0: "HiHello world", 1: "YoHello world"}


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
    reqs = requests_for(served, body["id"])
    assert [r.rid for r in reqs] == [body["id"] + "-0", body["id"] + "-1"]
    assert [r.params.seed for r in reqs] == [7, 8]
    assert served.backend.max_rids_per_msg >= 2  # one TextOutputs carried both


def test_completion_logprobs(served, http):
    r = http.post("/v1/completions", json={"prompt": "Hi", "logprobs": 2, "max_tokens": 2})
    assert r.status_code == 200, r.text
    lp = r.json()["choices"][0]["logprobs"]
    assert lp["tokens"] == ["token_id:11", "token_id:12"]
    assert lp["token_logprobs"] == [-0.5, -0.5]
    assert lp["top_logprobs"][0] == {"token_id:100": -0.5, "token_id:101": -1.5}
    assert lp["text_offset"] == [0, 5]
    (req,) = requests_for(served, r.json()["id"])
    assert req.params.logprobs == 2


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


def test_models(served, http):
    body = http.get("/v1/models").json()
    assert body["object"] == "list"
    assert [m["id"] for m in body["data"]] == [served.config.model_name]
    assert body["data"][0]["max_model_len"] == 2048
    assert http.get(f"/v1/models/{served.config.model_name}").status_code == 200
    assert http.get("/v1/models/nope").json()["error"]["code"] == "model_not_found"


def test_logprobs_that_are_not_finite_go_out_as_openais_floor(served, http):
    """Overflowed logits (NaN, +-inf logprobs from the engine) reach the client as -9999.0,
    OpenAI's value for an impossible token: the response renders (JSON has no infinities;
    it was a 500) and a stream carries no `NaN` or `-Infinity` a strict parser refuses."""
    body = {"prompt": "nonfinite", "logprobs": 3, "max_tokens": 2}
    r = http.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    lp = r.json()["choices"][0]["logprobs"]
    assert lp["token_logprobs"] == [-9999.0, -9999.0]
    assert lp["top_logprobs"][0] == {f"token_id:{100 + k}": -9999.0 for k in range(3)}
    chat = {"messages": [{"role": "user", "content": "nonfinite"}], "max_tokens": 2}
    r = http.post("/v1/chat/completions", json={**chat, "logprobs": True, "top_logprobs": 2})
    assert r.status_code == 200, r.text
    content = r.json()["choices"][0]["logprobs"]["content"]
    assert [c["logprob"] for c in content] == [-9999.0, -9999.0]
    assert [t["logprob"] for t in content[0]["top_logprobs"]] == [-9999.0, -9999.0]
    with http.stream("POST", "/v1/completions", json={**body, "stream": True}) as s:
        text = s.read().decode()
    assert "NaN" not in text and "Infinity" not in text
    events = [e for e in parse_sse(text) if e != "[DONE]"]
    assert [v for e in events for v in e["choices"][0]["logprobs"]["token_logprobs"]] == [
        -9999.0,
        -9999.0,
    ]
