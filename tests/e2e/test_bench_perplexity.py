"""benchmarks/bench_perplexity.py: llama-perplexity's windows and scoring, checked on a
fake server (httpx.MockTransport) whose log-probs are a known function of the tokens, and
llama-perplexity's output read back."""

from __future__ import annotations

import json
import math

import httpx
import pytest

from benchmarks.bench_perplexity import parse_args, server_perplexity
from benchmarks.perplexity.llama_perplexity import command, parse_output
from benchmarks.perplexity.windows import Perplexity, plan_windows, scored_logprobs

BOS = 1


def fake_logprob(token: int, position: int) -> float:
    # depends on both, so a window shifted by one token or one position scores differently
    return -0.01 * (token % 97 + 1) - 0.001 * position


class FakeServer:
    """/v1/models, /tokenize (one token per character, BOS first when `adds_bos`) and
    /v1/completions answering echo + logprobs for token-id prompts, as the server does:
    one log-prob per prompt token, the first null."""

    def __init__(self, adds_bos: bool) -> None:
        self.adds_bos = adds_bos
        self.prompts: list[list[int]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "fake"}]})
        body = json.loads(request.content)
        if path == "/tokenize":
            ids = [100 + ord(c) for c in body["prompt"]]
            if body["add_special_tokens"] and self.adds_bos:
                ids = [BOS, *ids]
            return httpx.Response(200, json={"tokens": ids, "count": len(ids)})
        assert path == "/v1/completions"
        assert body["echo"] is True and body["max_tokens"] == 0 and body["logprobs"] == 0
        ids = body["prompt"]
        self.prompts.append(ids)
        lps = [None] + [fake_logprob(t, j) for j, t in enumerate(ids) if j > 0]
        choice = {"text": "", "logprobs": {"token_logprobs": lps, "tokens": [""] * len(ids)}}
        return httpx.Response(200, json={"choices": [choice]})


def expected_ppl(tokens: list[int], n_ctx: int, chunks: int) -> tuple[float, int]:
    """llama-perplexity's sum written out: chunk i scores tokens[i*n_ctx + j] for
    j in n_ctx//2 + 1 .. n_ctx - 1, each at its position j in the window."""
    nll, count = 0.0, 0
    for i in range(chunks):
        for j in range(n_ctx // 2 + 1, n_ctx):
            nll -= fake_logprob(tokens[i * n_ctx + j], j)
            count += 1
    return math.exp(nll / count), count


@pytest.mark.parametrize("adds_bos", [False, True])
@pytest.mark.parametrize(("n_ctx", "chunks"), [(8, 0), (16, 2), (7, 0)])
def test_server_perplexity_scores_llama_perplexity_windows(adds_bos, n_ctx, chunks):
    text = "It is a truth universally acknowledged, that a single man"  # 57 characters
    fake = FakeServer(adds_bos)
    args = parse_args(
        ["--base-url", "http://fake", "--ctx-size", str(n_ctx), "--chunks", str(chunks)]
    )
    with httpx.Client(base_url="http://fake", transport=httpx.MockTransport(fake)) as client:
        res = server_perplexity(args, client, text)
    tokens = ([BOS] if adds_bos else []) + [100 + ord(c) for c in text]
    n_chunks = len(tokens) // n_ctx if chunks == 0 else min(chunks, len(tokens) // n_ctx)
    ppl, count = expected_ppl(tokens, n_ctx, n_chunks)
    assert res["num_chunks"] == n_chunks == len(fake.prompts)
    assert res["scored_tokens"] == count == n_chunks * (n_ctx - n_ctx // 2 - 1)
    assert res["ppl"] == pytest.approx(ppl, rel=1e-12)
    assert res["bos_id"] == (BOS if adds_bos else None)
    for i, sent in enumerate(fake.prompts):  # each window as llama-perplexity evaluates it
        window = tokens[i * n_ctx : (i + 1) * n_ctx]
        assert sent == ([BOS, *window[1:]] if adds_bos else window)


def test_hand_computed_window_arithmetic():
    # n_ctx 4: first = 2, so each chunk scores only its last token (position 3)
    tokens = list(range(10, 20))  # 10 tokens: 2 chunks of 4, 2 tokens left over
    windows = plan_windows(tokens, 4, bos_id=None)
    assert [w.token_ids for w in windows] == [[10, 11, 12, 13], [14, 15, 16, 17]]
    assert scored_logprobs([None, -9.0, -9.0, -0.5], 4) == [-0.5]
    acc = Perplexity()
    acc.add([-0.5])
    acc.add([-1.5])
    assert acc.ppl == pytest.approx(math.exp(1.0))
    assert acc.running == pytest.approx([math.exp(0.5), math.exp(1.0)])
    # var of (0.5, 1.5) = 0.25; sqrt(0.25 / 1) * e
    assert acc.stderr == pytest.approx(0.5 * math.e)
    assert [w.token_ids[0] for w in plan_windows(tokens, 4, bos_id=1)] == [1, 1]
    assert len(plan_windows(tokens, 4, num_chunks=1)) == 1


def test_bad_inputs_say_why():
    with pytest.raises(ValueError, match="at least 16"):
        plan_windows(list(range(15)), 8)
    with pytest.raises(ValueError, match="expected 8 prompt log-probs"):
        scored_logprobs([None] + [-1.0] * 8, 8)  # a BOS added by the server
    with pytest.raises(ValueError, match="positions \\[6\\]"):
        scored_logprobs([None, -1, -1, -1, -1, -1, None, -1], 8)


LLAMA_OUTPUT = """\
perplexity: tokenizing the input ..
perplexity: tokenization took 12.3 ms
perplexity: calculating perplexity over 3 chunks, n_ctx=512, batch_size=2048, n_seq=4
perplexity: 4.10 seconds per pass - ETA 0.07 minutes
[1]14.1234,[2]15.5678,[3]16.0001,
Final estimate: PPL = 16.0001 +/- 0.81234

llama_perf_context_print:        load time =     123.45 ms
"""


def test_llama_perplexity_output_is_read():
    res = parse_output(LLAMA_OUTPUT)
    assert (res.ppl, res.stderr, res.num_chunks, res.n_ctx) == (16.0001, 0.81234, 3, 512)
    assert res.running == [14.1234, 15.5678, 16.0001]
    with pytest.raises(ValueError, match="Final estimate"):
        parse_output("main: error: failed to load model\n")
    assert command("lp", "m.gguf", "t.txt", 512, 8, 2) == [
        "lp", "-m", "m.gguf", "-f", "t.txt", "-c", "512", "-t", "2", "--chunks", "8",
    ]  # fmt: skip
