"""End to end: what the server reports beside the text: /metrics counters, cached tokens
in usage, stage timings, and the tokenizer endpoints."""

from __future__ import annotations

import time

import httpx
import pytest

from tests.e2e.conftest import CHATS, chat_ids

pytestmark = pytest.mark.timeout(300)


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
    # every stage must be there (and the draft counts, where the default speculation
    # drafted); the ones that run the model take time
    assert set(t) - {"num_draft_tokens", "num_accepted_tokens"} == {
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
