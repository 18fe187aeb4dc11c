"""Speculative decoding through the real processes: a server with ngram drafts answers
the OpenAI SDK with the same greedy text whether the request drafts or not
("speculative": false as an extra body field), streamed or whole, reports the counts in
usage.timings and /metrics, and refuses a bad --num-speculative-tokens at start."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import httpx
import openai
import pytest

from benchmarks.bench_spec import PASSAGE
from tests.e2e.conftest import REPO

pytestmark = pytest.mark.timeout(300)

STEP_LABELS = {"engine": "0", "method": "ngram", "kind": "verify"}
MESSAGES = [
    {"role": "user", "content": f"Repeat the following passage word for word.\n\n{PASSAGE}"}
]


def ask_greedy(
    client: openai.OpenAI, messages: list, max_tokens: int, spec: bool, stream: bool = False
) -> tuple[str, dict]:
    """A greedy chat answer with or without drafts: (text, usage.timings; {} streamed)."""
    extra = {"speculative": spec, "return_timings": True}
    kw = dict(model="smollm2", messages=messages, max_tokens=max_tokens, temperature=0)
    if not stream:
        r = client.chat.completions.create(**kw, extra_body=extra)  # type: ignore[call-overload]
        return r.choices[0].message.content, (r.usage.model_extra or {}).get("timings") or {}
    chunks = client.chat.completions.create(**kw, stream=True, extra_body=extra)  # type: ignore[call-overload]
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices), {}


@pytest.fixture(scope="module")
def spec_server(ngram_server):
    return ngram_server


def test_same_text_with_and_without_drafts(spec_server):
    client = openai.OpenAI(
        base_url=spec_server.url + "/v1", api_key="x", max_retries=0, timeout=120
    )

    def ask(spec: bool, stream: bool = False) -> tuple[str, dict]:
        return ask_greedy(client, MESSAGES, 64, spec, stream)

    plain, plain_timings = ask(False)
    drafted, timings = ask(True)
    assert drafted == plain and len(plain) > 100
    assert "num_draft_tokens" not in plain_timings
    assert timings["num_accepted_tokens"] > 10  # the passage was drafted from the prompt
    assert ask(True, stream=True)[0] == plain
    m = spec_server.wait_idle()
    assert m['zeroserve:spec_decode_num_accepted_tokens_total{engine="0"}'] >= 2 * 10
    stats: dict = {}
    for _ in range(100):  # the replica's next beat carries its counts
        stats = httpx.get(spec_server.url + "/stats", timeout=10).json()["replicas"][0]
        if stats["spec_draft_tokens"]:
            break
        time.sleep(0.1)
    assert stats["spec_method"] == "ngram" and 0 < stats["spec_acceptance_rate"] <= 1
    assert stats["spec_accepted_tokens"] >= 2 * 10
    m = spec_server.wait_idle()
    (verify,) = [
        v
        for k, v in m.items()
        if k.startswith("zeroserve:spec_decode_num_steps_total{")
        and all(f'{label}="{want}"' in k for label, want in STEP_LABELS.items())
    ]
    assert verify > 0


def test_out_of_range_speculative_tokens_refused_at_start():
    r = subprocess.run(
        [sys.executable, str(REPO / "launch.py"), "--num-speculative-tokens", "17", "--port", "1"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert r.returncode == 2
    assert "num_speculative_tokens" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_sigkill_of_the_scheduler_during_speculative_steps(spec_server):
    """SIGKILL of the scheduler while 16 streams verify drafts: every stream ends with an
    error event within the fault tests' bound, the replica comes back and serves."""
    from tests.e2e.test_faults import (
        END_WITHIN_S,
        N_STREAMS,
        component_pid,
        recovered,
        streams_under_fault,
    )

    victim = component_pid(spec_server, "scheduler_worker")
    verifies: list[float] = []

    def kill() -> None:
        deadline = time.monotonic() + 20  # until the replica's beat shows verify steps
        while not verifies or (verifies[-1] == 0 and time.monotonic() < deadline):
            m = spec_server.metrics()
            steps = "zeroserve:spec_decode_num_steps_total{"
            verifies.append(sum(v for k, v in m.items() if k.startswith(steps)))
            time.sleep(0.1)
        os.kill(victim, signal.SIGKILL)

    outcomes, last_end = streams_under_fault(spec_server, kill, max_tokens=400)
    assert verifies[-1] > 0  # drafts were being verified when it died
    assert outcomes == ["error"] * N_STREAMS, outcomes
    assert last_end <= END_WITHIN_S, f"a stream ended {last_end:.1f} s after the kill"
    recovered(spec_server)
