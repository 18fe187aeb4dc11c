"""Suffix drafts through the real processes: a server started with `--speculative-method
suffix` answers the OpenAI SDK with the same greedy text whether the request drafts or not,
streamed or whole, and a later request drafts from an earlier one's output (the scheduler's
store of recent outputs): its accepted count, in usage.timings and /metrics, grows."""

from __future__ import annotations

import openai
import pytest

from benchmarks.spec_workloads import agent_messages
from tests.e2e.conftest import served

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def suffix_server(default_model_dir):
    yield from served(
        "--speculative-method",
        "suffix",
        "--num-speculative-tokens",
        "4",
        "--speculative-policy",
        "always",  # every draft verified: the counts below are the drafter's
        workers=1,
    )


def test_later_requests_draft_from_earlier_outputs(suffix_server):
    client = openai.OpenAI(
        base_url=suffix_server.url + "/v1", api_key="x", max_retries=0, timeout=120
    )
    # a session's third turn: two calls and their results so far (as user messages: the
    # API wants a tool message to answer an assistant's tool_calls entry)
    messages = [{**m, "role": "user"} if m["role"] == "tool" else m for m in agent_messages()[2]]

    def ask(spec: bool, stream: bool = False) -> tuple[str, dict]:
        extra = {"speculative": spec, "return_timings": True}
        kw = dict(model="smollm2", messages=messages, max_tokens=64, temperature=0)
        if not stream:
            r = client.chat.completions.create(**kw, extra_body=extra)  # type: ignore[call-overload]
            return r.choices[0].message.content, (r.usage.model_extra or {}).get("timings") or {}
        chunks = client.chat.completions.create(**kw, stream=True, extra_body=extra)  # type: ignore[call-overload]
        return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices), {}

    first, first_timings = ask(True)  # the store is empty: drafts from its own prompt only
    plain, plain_timings = ask(False)
    again, timings = ask(True)  # the store holds the two outputs before
    assert first == plain == again and len(plain) > 20
    assert "num_draft_tokens" not in plain_timings
    accepted = timings["num_accepted_tokens"]
    assert accepted > first_timings.get("num_accepted_tokens", 0)
    assert accepted >= timings["num_draft_tokens"] * 0.8 and accepted >= 10
    assert ask(True, stream=True)[0] == plain
    m = suffix_server.wait_idle()
    total = m['zeroserve:spec_decode_num_accepted_tokens_total{engine="0"}']
    assert total >= accepted + first_timings.get("num_accepted_tokens", 0)
