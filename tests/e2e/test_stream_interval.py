"""--stream-interval 8 through the real processes: the same text as without streaming,
the first token at once, then a chunk per 8 tokens and one at the finish."""

from __future__ import annotations

import json

import httpx
import pytest

pytestmark = pytest.mark.timeout(300)

BODY = {
    "prompt": "The history of the printing press",
    "max_tokens": 30,
    "temperature": 0,
    "ignore_eos": True,
}


def test_stream_interval_8_same_text_fewer_chunks(float_server):
    url = float_server.url + "/v1/completions"
    whole = httpx.post(url, json=BODY, timeout=120).json()["choices"][0]["text"]
    opts = {"include_usage": True, "continuous_usage_stats": True}
    body = {**BODY, "stream": True, "stream_options": opts}
    with httpx.stream("POST", url, json=body, timeout=120) as r:
        assert r.status_code == 200, r.read()
        events = [line.removeprefix("data: ") for line in r.iter_lines() if line]
    assert events[-1] == "[DONE]"
    chunks = [c for c in map(json.loads, events[:-1]) if c["choices"]]
    assert "".join(c["choices"][0]["text"] for c in chunks) == whole
    # the first token at once, then every 8, then the finish
    assert [c["usage"]["completion_tokens"] for c in chunks] == [1, 9, 17, 25, 30]
