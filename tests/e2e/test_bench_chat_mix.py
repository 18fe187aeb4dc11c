"""bench_serving.py --mix chat: issue 52's chat mix sent to the session's real server in
both dialects, every output checked (benchmarks/serving/mix.py); and the checks refuse
what they must."""

from __future__ import annotations

import asyncio
import math

import pytest

from benchmarks.bench_serving import parse_args, request_body, run_benchmark
from benchmarks.serving.mix import check_output, top_logprobs
from benchmarks.serving.prompts import Spec

pytestmark = pytest.mark.timeout(180)


def test_the_mix_by_index_and_its_checks():
    args = parse_args(["--mix", "chat", "--endpoint", "/v1/chat/completions"])
    bodies = [request_body(args, "m", Spec("hi", 1, 8), i) for i in range(16)]
    assert sum(b["temperature"] == 0.0 for b in bodies) == 4
    assert [i for i, b in enumerate(bodies) if "seed" in b] == [1, 5, 9, 13]
    assert [i for i, b in enumerate(bodies) if b.get("top_logprobs") == 5] == [2, 10]
    assert [i for i, b in enumerate(bodies) if "presence_penalty" in b] == [3, 11]
    assert [i for i, b in enumerate(bodies) if "response_format" in b] == [6]
    assert check_output(6, '{"answer": "yes", "score": 3}', []) is None
    assert "does not parse" in (check_output(6, '{"answer": "ye', []) or "")
    assert "not the object" in (check_output(6, '{"answer": "maybe", "score": 3}', []) or "")
    assert "none" in (check_output(2, "text", []) or "")
    assert check_output(2, "t", [[math.log(0.5), math.log(0.4)]]) is None
    assert "sum to" in (check_output(2, "t", [[math.log(0.7), math.log(0.5)]]) or "")
    chat = {"logprobs": {"content": [{"logprob": -1, "top_logprobs": [{"logprob": -0.5}]}]}}
    assert top_logprobs(chat, True) == [[-0.5]]
    assert top_logprobs({"logprobs": {"top_logprobs": [{"a": -0.1, "b": -3.0}]}}, False) == [
        [-0.1, -3.0]
    ]


@pytest.mark.parametrize("endpoint", ["/v1/chat/completions", "/v1/completions"])
def test_the_chat_mix_served_and_every_output_valid(server, endpoint):
    args = parse_args(
        [
            "--base-url",
            server.url,
            "--disable-tqdm",
            "--mix",
            "chat",
            "--endpoint",
            endpoint,
            "--num-prompts",
            "16",
            "--max-concurrency",
            "8",
            "--dataset",
            "fixed",
            "--prompt",
            "Is the sky blue? Answer and rate your certainty.",
            "--output-len",
            "12",
        ]
    )
    res = asyncio.run(run_benchmark(args))
    assert res["completed"] == 16 and res["failed"] == 0, res["errors"]
    # each passed mix.check_output: the schema row's object parsed, the logprob rows' top
    # logprobs came and summed to at most 1
    assert all(r["success"] and r["output_tokens"] > 0 for r in res["requests"])
    server.wait_idle()
