"""--reasoning-parser: the parsers piece by piece, and the chat, Messages and Responses
shapes of a fake model that thinks ("think": THINK_WORDS, its tags split across steps),
streamed and not; chat_template_kwargs and reasoning_effort reaching the tokenizer."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from common.reasoning_formats import ReasoningParser, new_parser
from tests.frontend.conftest import Served, serve
from tests.frontend.sse import parse_sse
from tests.frontend.test_anthropic import parse_events

pytestmark = pytest.mark.timeout(30)


def feed_all(p: ReasoningParser, pieces: list[str]) -> tuple[list[str], list[str]]:
    out = [p.feed(t, i == len(pieces) - 1) for i, t in enumerate(pieces)]
    return [r for r, _ in out], [c for _, c in out]


@pytest.mark.parametrize("name", ["qwen3", "think", "deepseek_r1"])
def test_tags_split_across_pieces(name: str) -> None:
    pieces = ["<", "thi", "nk>Let", " me see<", "/th", "ink", ">\nThe", " answer"]
    reasoning, content = feed_all(new_parser(name), pieces)
    assert "".join(reasoning) == "Let me see"
    assert "".join(content) == "\nThe answer"
    # nothing of a tag went out while it was incomplete
    assert reasoning[:3] == ["", "", "Let"] and reasoning[3] == " me see"
    assert content[:6] == [""] * 6


def test_no_closing_tag_is_all_reasoning() -> None:
    reasoning, content = feed_all(new_parser("qwen3"), ["<think>a", " b</thi"])
    assert "".join(reasoning) == "a b</thi" and "".join(content) == ""


def test_deepseek_r1_without_opening_tag() -> None:
    reasoning, content = feed_all(new_parser("deepseek_r1"), ["I think", "</think>", "Yes"])
    assert (reasoning, content) == (["I think", "", ""], ["", "", "Yes"])
    # never closed: all of it is reasoning
    assert feed_all(new_parser("deepseek_r1"), ["just", " thoughts"]) == (
        ["just", " thoughts"],
        ["", ""],
    )


@pytest.mark.parametrize("name", ["qwen3", "think"])
def test_qwen3_without_think_is_content(name: str) -> None:
    reasoning, content = feed_all(new_parser(name), ["I think", "</think>", "Yes"])
    assert "".join(reasoning) == "" and "".join(content) == "I think</think>Yes"
    # a start that looked like the tag, but was not, comes out as content after all
    assert feed_all(new_parser(name), ["<th", "is"]) == (["", ""], ["", "<this"])
    assert feed_all(new_parser(name), ["<thi"]) == ([""], ["<thi"])


@pytest.fixture(scope="module")
def thinking() -> Iterator[Served]:
    with serve(reasoning_parser="qwen3") as s:
        yield s


@pytest.fixture
def http(thinking: Served) -> Iterator[httpx.Client]:
    with thinking.client() as c:
        yield c


def chat(**kw) -> dict:
    return {"messages": [{"role": "user", "content": "think"}], **kw}


def test_chat(http: httpx.Client) -> None:
    r = http.post("/v1/chat/completions", json=chat())
    assert r.status_code == 200, r.text
    body = r.json()
    message = body["choices"][0]["message"]
    assert message["reasoning_content"] == "Let me see"
    assert message["content"] == "Hello world"
    # the output tokens up to the one that closed the reasoning: 4 of 5
    assert body["usage"]["completion_tokens_details"] == {"reasoning_tokens": 4}
    # a model that did not think: null reasoning
    r = http.post("/v1/chat/completions", json=chat(messages=[{"role": "user", "content": "Hi"}]))
    message = r.json()["choices"][0]["message"]
    assert message["reasoning_content"] is None and message["content"] == "Hello world!"


def test_chat_stream(http: httpx.Client) -> None:
    r = http.post("/v1/chat/completions", json=chat(stream=True))
    assert r.status_code == 200, r.text
    events = parse_sse(r.text)
    assert events[-1] == "[DONE]"
    deltas = [e["choices"][0]["delta"] for e in events[1:-1]]
    reasoning = "".join(d.get("reasoning_content", "") for d in deltas)
    content = "".join(d.get("content") or "" for d in deltas)
    assert (reasoning, content) == ("Let me see", "Hello world")
    assert not any("<" in str(d) for d in deltas)  # no tag, no piece of one
    assert not any("reasoning_content" in d and d.get("content") for d in deltas[:3])


def test_tool_parser_sees_only_the_content(http: httpx.Client) -> None:
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    r = http.post("/v1/chat/completions", json=chat(tools=tools, tool_choice="auto"))
    assert r.status_code == 200, r.text
    message = r.json()["choices"][0]["message"]
    assert message["reasoning_content"] == "Let me see" and message["content"] == "Hello world"


def test_messages_thinking_blocks(http: httpx.Client) -> None:
    body = {
        "model": "smollm2",
        "max_tokens": 16,
        "messages": [{"role": "user", "content": "think"}],
    }
    r = http.post("/v1/messages", json=body)
    assert r.status_code == 200, r.text
    assert r.json()["content"] == [
        {"type": "thinking", "thinking": "Let me see", "signature": ""},
        {"type": "text", "text": "Hello world"},
    ]
    r = http.post("/v1/messages", json={**body, "stream": True})
    events = parse_events(r.text)
    starts = [d["content_block"]["type"] for n, d in events if n == "content_block_start"]
    assert starts == ["thinking", "text"]
    deltas = [d["delta"] for n, d in events if n == "content_block_delta"]
    thinking = "".join(d["thinking"] for d in deltas if d["type"] == "thinking_delta")
    text = "".join(d["text"] for d in deltas if d["type"] == "text_delta")
    assert (thinking, text) == ("Let me see", "Hello world")


def test_responses_reasoning_item(http: httpx.Client) -> None:
    r = http.post("/v1/responses", json={"model": "smollm2", "input": "think"})
    assert r.status_code == 200, r.text
    out = r.json()
    reasoning, message = out["output"]
    assert reasoning["type"] == "reasoning" and reasoning["id"].startswith("rs_")
    assert reasoning["summary"] == []
    assert reasoning["content"] == [{"type": "reasoning_text", "text": "Let me see"}]
    assert message["content"][0]["text"] == "Hello world"
    assert out["usage"]["output_tokens_details"] == {"reasoning_tokens": 4}
    r = http.post("/v1/responses", json={"model": "smollm2", "input": "think", "stream": True})
    events = [e for e in parse_sse_events(r.text)]
    kinds = [e["type"] for e in events]
    assert "response.reasoning_text.done" in kinds
    deltas = "".join(e["delta"] for e in events if e["type"] == "response.reasoning_text.delta")
    assert deltas == "Let me see"
    done = events[-1]["response"]
    assert [i["type"] for i in done["output"]] == ["reasoning", "message"]
    assert done["output"][1]["content"][0]["text"] == "Hello world"
    assert done["usage"]["output_tokens_details"] == {"reasoning_tokens": 4}


def parse_sse_events(text: str) -> list[dict]:
    return [data for _, data in parse_events(text)]


def test_template_kwargs_reach_the_tokenizer(thinking: Served, http: httpx.Client) -> None:
    def sent(**kw) -> dict | None:
        r = http.post("/v1/chat/completions", json=chat(**kw))
        assert r.status_code == 200, r.text
        rid = r.json()["id"]
        with thinking.backend.lock:
            (req,) = [q for q in thinking.backend.requests if q.rid.startswith(rid + "-")]
        return req.chat_template_kwargs

    assert sent() is None
    assert sent(chat_template_kwargs={"enable_thinking": False, "x": [1]}) == {
        "enable_thinking": False,
        "x": [1],
    }
    assert sent(reasoning_effort="minimal") == {"enable_thinking": False}
    assert sent(reasoning_effort="high") == {"enable_thinking": True}
    # the request's own switch wins over the effort
    kw = {"enable_thinking": False}
    assert sent(reasoning_effort="high", chat_template_kwargs=kw) == kw
    for bad in ({"reasoning_effort": "extreme"}, {"chat_template_kwargs": {"messages": []}}):
        r = http.post("/v1/chat/completions", json=chat(**bad))
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == next(iter(bad))
