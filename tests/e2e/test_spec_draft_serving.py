"""A draft model through the real processes: `launch.py --speculative-model smollm2` (the
embedded Q4_1 file drafting for the same model's float32 weights) answers the OpenAI SDK
with the same greedy text whether the request drafts or not, streamed or whole; most
drafts are accepted (usage.timings), and /metrics names the method `draft`; concurrent
requests with stop strings (rows drafting in one batch, stopping mid-draft) too."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from itertools import repeat

import openai
import pytest

from tests.e2e.conftest import served
from tests.e2e.test_spec_serving import ask_greedy

pytestmark = pytest.mark.timeout(300)

MESSAGES = [{"role": "user", "content": "Write two sentences about the sea."}]
QUESTIONS = [
    "Name three colours of the rainbow.",
    "What is the capital of France? Answer in a sentence.",
    "Count from one to ten in words.",
    "Write two sentences about the sea.",
]


@pytest.fixture(scope="module")
def draft_server(default_model_dir):
    yield from served(
        "--quantization",
        "none",  # the served weights float32, the draft the file's Q4_1 blocks
        "--speculative-model",
        "smollm2",
        "--num-speculative-tokens",
        "4",
        "--speculative-policy",
        "always",  # the counts asserted are the drafter's: the adaptive fit may drop drafts
        workers=1,
    )


def test_draft_model_serves_the_same_text(draft_server):
    client = openai.OpenAI(
        base_url=draft_server.url + "/v1", api_key="x", max_retries=0, timeout=120
    )

    def ask(spec: bool, stream: bool = False) -> tuple[str, dict]:
        return ask_greedy(client, MESSAGES, 40, spec, stream)

    plain, plain_timings = ask(False)
    drafted, timings = ask(True)
    assert drafted == plain and len(plain) > 40
    assert "num_draft_tokens" not in plain_timings
    assert timings["num_accepted_tokens"] > timings["num_draft_tokens"] // 2 > 5, timings
    assert ask(True, stream=True)[0] == plain
    m = draft_server.wait_idle()
    steps = {k: v for k, v in m.items() if k.startswith("zeroserve:spec_decode_num_steps")}
    assert any('method="draft"' in k and 'kind="verify"' in k and v > 0 for k, v in steps.items())


def _ask(client: openai.OpenAI, question: str, stop: list[str], spec: bool, stream: bool):
    """(text, usage.timings: {} streamed)."""
    kw = dict(
        model="smollm2",
        messages=[{"role": "user", "content": question}],
        max_tokens=40,
        temperature=0,
        stop=stop or None,
        extra_body={"speculative": spec, "return_timings": True},
    )
    if not stream:
        r = client.chat.completions.create(**kw)  # type: ignore[call-overload]
        return r.choices[0].message.content or "", (r.usage.model_extra or {}).get("timings")
    chunks = client.chat.completions.create(**kw, stream=True)  # type: ignore[call-overload]
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices), {}


def test_concurrent_stop_strings_same_text(draft_server):
    client = openai.OpenAI(
        base_url=draft_server.url + "/v1", api_key="x", max_retries=0, timeout=240
    )
    plain = [_ask(client, q, [], False, False)[0] for q in QUESTIONS]
    # stop at a word from the middle of each plain answer: the stop falls mid-draft
    stops = [[p.split()[len(p.split()) // 2]] for p in plain]
    before = [p[: p.find(s[0])] for p, s in zip(plain, stops)]
    with ThreadPoolExecutor(len(QUESTIONS)) as pool:  # concurrent rows draft in one batch
        runs = [
            list(pool.map(_ask, repeat(client), QUESTIONS, stop, repeat(spec), repeat(stream)))
            for stop, spec, stream in (
                ([[]] * len(QUESTIONS), True, False),
                (stops, True, False),
                (stops, True, True),
                (stops, False, True),
            )
        ]
    assert [text for text, _ in runs[0]] == plain
    assert [[text for text, _ in run] for run in runs[1:]] == [before] * 3
    # (a request a stop string ends has no engine timings: counted where none stopped)
    drafted = sum(t["num_draft_tokens"] for _, t in runs[0])
    accepted = sum(t["num_accepted_tokens"] for _, t in runs[0])
    assert accepted > drafted / 2 > 8, (drafted, accepted)
