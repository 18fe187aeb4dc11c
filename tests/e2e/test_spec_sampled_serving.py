"""Speculative decoding for sampled requests through the real processes: a server with
ngram drafts answers a seeded temperature-0.7 request (the OpenAI SDK) with the same text
whether it drafts or not ("speculative": false as an extra body field), streamed or
whole, and its logprobs with it; the drafts were verified (usage.timings)."""

from __future__ import annotations

import openai
import pytest

from benchmarks.bench_spec import PASSAGE

pytestmark = pytest.mark.timeout(600)

MESSAGES = [
    {"role": "user", "content": f"Repeat the following passage word for word.\n\n{PASSAGE}"}
]


@pytest.fixture(scope="module")
def spec_server(ngram_server):
    return ngram_server


def test_seeded_sampled_text_same_with_and_without_drafts(spec_server):
    client = openai.OpenAI(
        base_url=spec_server.url + "/v1", api_key="x", max_retries=0, timeout=120
    )
    kw = dict(model="smollm2", messages=MESSAGES, max_tokens=48, temperature=0.7, seed=42)

    def ask(spec: bool, stream: bool = False, **more) -> tuple[str, dict, list]:
        extra = {"speculative": spec, "return_timings": True}
        if not stream:
            r = client.chat.completions.create(**kw, **more, extra_body=extra)  # type: ignore[call-overload]
            timings = (r.usage.model_extra or {}).get("timings") or {}
            lps = r.choices[0].logprobs.content if r.choices[0].logprobs else []
            return r.choices[0].message.content, timings, lps
        chunks = client.chat.completions.create(**kw, **more, stream=True, extra_body=extra)  # type: ignore[call-overload]
        return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices), {}, []

    plain, plain_timings, _ = ask(False)
    drafted, timings, _ = ask(True)
    assert drafted == plain and len(plain) > 60
    assert "num_draft_tokens" not in plain_timings
    assert timings["num_accepted_tokens"] > 5  # the passage was drafted from the prompt
    assert ask(True, stream=True)[0] == plain
    # another seed, another text (the seed is used), the same with drafts
    kw["seed"] = 7
    other = ask(False)[0]
    assert other != plain and ask(True)[0] == other
    # logprobs of the accepted drafts: one per token, as without drafts
    text, _, lps = ask(True, logprobs=True, top_logprobs=2)
    want_text, _, want = ask(False, logprobs=True, top_logprobs=2)
    assert text == want_text and len(lps) == len(want) > 10
    for got, exp in zip(lps, want):
        assert got.token == exp.token and got.logprob == pytest.approx(exp.logprob, abs=1e-3)
        assert [t.token for t in got.top_logprobs] == [t.token for t in exp.top_logprobs]
