"""benchmarks/bench_serving.py: the schedule and summary math on their own, then short runs
in process against the session's real server (all at once, with a concurrency limit and
without streaming, on a fixed submit interval, from two client processes)."""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random

import numpy as np
import pytest

from benchmarks.bench_serving import (
    arrival_offsets,
    format_results,
    latency_stats,
    main,
    parse_args,
    peak_concurrency,
    percentile,
    random_prompts,
    resolve_client_processes,
    run_benchmark,
    summarize,
    token_time_series,
)

pytestmark = pytest.mark.timeout(120)


# -- no server ----------------------------------------------------------------------------
def test_arrival_schedules():
    assert arrival_offsets(4) == [0.0] * 4
    assert arrival_offsets(0, 5.0) == []
    assert arrival_offsets(4, submit_interval_ms=50) == pytest.approx([0, 0.05, 0.10, 0.15])

    a = arrival_offsets(4000, 20.0, seed=7)
    assert a == arrival_offsets(4000, 20.0, seed=7)  # seeded
    assert a != arrival_offsets(4000, 20.0, seed=8)
    assert a[0] == 0.0 and all(x <= y for x, y in zip(a, a[1:]))
    gaps = np.diff(a)
    assert gaps.mean() == pytest.approx(1 / 20, rel=0.06)  # mean gap 1/rate
    assert gaps.std() == pytest.approx(1 / 20, rel=0.1)  # exponential: std == mean
    bursty = np.diff(arrival_offsets(4000, 20.0, burstiness=0.25, seed=7))
    assert bursty.mean() == pytest.approx(1 / 20, rel=0.15)
    assert bursty.std() > 1.5 * gaps.std()  # gamma shape 0.25: std = 2 * mean
    with pytest.raises(ValueError):
        arrival_offsets(3, 0.0)


def test_percentiles_and_summary():
    rng = random.Random(0)
    vals = [rng.random() for _ in range(101)]
    for p in (0, 50, 90, 99, 100):
        assert percentile(vals, p) == pytest.approx(np.percentile(vals, p))
    assert percentile([3.0], 99) == 3.0
    st = latency_stats([0.001, 0.002, 0.003, 0.010])
    assert st["mean"] == pytest.approx(4.0) and st["median"] == pytest.approx(2.5)
    assert st["p99"] == pytest.approx(np.percentile([1, 2, 3, 10], 99))
    assert latency_stats([])["mean"] is None

    def rec(ok, ttft, e2e, out, prompt_tokens=10, prompt_len=9):
        tpot = (e2e - ttft) / (out - 1) if ok and out > 1 else None
        return {
            "success": ok,
            "error": None if ok else "HTTP 500: boom",
            "ttft_s": ttft,
            "tpot_s": tpot,
            "e2e_s": e2e,
            "output_tokens": out if ok else None,
            "prompt_tokens": prompt_tokens,
            "prompt_len": prompt_len,
        }

    records = [
        rec(True, 0.1, 1.1, 11),
        rec(True, 0.3, 2.3, 21, None, 9),
        rec(False, None, None, 0),
        rec(False, None, None, 0),
    ]
    s = summarize(records, 2.0, itls_s=[0.1, 0.1, 0.1, 0.1])
    assert (s["completed"], s["failed"]) == (2, 2)
    assert s["total_output_tokens"] == 32 and s["total_input_tokens"] == 19  # 10 + local 9
    assert s["input_tokens_from_server"] is False
    assert s["request_throughput"] == pytest.approx(1.0)
    assert s["output_throughput"] == pytest.approx(16.0)
    assert s["total_token_throughput"] == pytest.approx(25.5)
    assert s["mean_ttft_ms"] == pytest.approx(200.0) and s["median_ttft_ms"] == pytest.approx(200.0)
    assert s["mean_tpot_ms"] == pytest.approx(100.0)
    assert s["mean_e2el_ms"] == pytest.approx(1700.0) and s["mean_itl_ms"] == pytest.approx(100.0)
    assert s["errors"] == [{"error": "HTTP 500: boom", "count": 2}]
    text = format_results(s)
    assert "Serving Benchmark Result" in text and "HTTP 500: boom" in text

    ts = token_time_series([(0.2, 5), (0.7, 5), (1.5, 4), (9.0, 1)], 2.5)
    assert ts["t_s"] == [0.0, 1.0, 2.0] and ts["end_s"] == 2.5
    assert ts["output_tokens_per_s"] == pytest.approx([10.0, 4.0, 2.0])  # the last bin is 0.5 s
    assert peak_concurrency([(0, 2), (1, 3), (2.5, 4), (5, 6)]) == 2


def test_random_prompts_hit_the_token_length(default_model_dir):
    from benchmarks.bench_serving import count_tokens, load_tokenizer

    tok = load_tokenizer(default_model_dir)
    specs = random_prompts(6, 64, 8, 0.25, random.Random(3), tok)
    for s in specs:
        assert 48 <= s.prompt_len <= 80 and 6 <= s.output_len <= 10
        assert s.prompt_len == count_tokens(tok, s.prompt)
    assert len({s.prompt for s in specs}) == 6
    long = random_prompts(1, 20_000, 8, 0.0, random.Random(0), tok)[0]  # longer than the text
    assert long.prompt_len == pytest.approx(20_000, rel=0.01)


def test_sse_lines_across_any_chunking():
    """The client's line splitter: every way of cutting a body into three chunks (empty
    ones included) gives its lines, CRLF or LF; a line longer than aiohttp's own line
    reader takes (128 KiB) comes whole; a last line without a newline comes too."""
    from benchmarks.serving.client import _lines

    class Body:
        def __init__(self, chunks: list[bytes]) -> None:
            self.content = self
            self.chunks = chunks

        async def iter_any(self):
            for c in self.chunks:
                yield c

    async def lines(chunks: list[bytes]) -> list[bytes]:
        return [line async for line in _lines(Body(chunks))]

    body = b'data: {"a":1}\r\n\r\ndata: [DONE]\n\n'
    want = [b'data: {"a":1}\r', b"\r", b"data: [DONE]", b""]
    for i in range(len(body) + 1):
        for j in range(i, len(body) + 1):
            assert asyncio.run(lines([body[:i], body[i:j], body[j:]])) == want, (i, j)
    long = b"data: " + b"x" * 300_000
    assert asyncio.run(lines([long[:70_000], long[70_000:], b"\n", b"tail"])) == [long, b"tail"]


def test_client_processes_auto_rule_and_failures():
    r = resolve_client_processes
    assert r(0, 8, None, cpu_count=16) == 1  # concurrency 8 < 16
    assert r(0, 100, 15, cpu_count=16) == 1
    assert r(0, 100, 16, cpu_count=16) == 2  # 16 // 8
    assert r(0, 100, None, cpu_count=16) == 4  # at most 4
    assert r(0, 1000, 128, cpu_count=6) == 3  # cpus // 2
    assert r(0, 1000, 128, cpu_count=1) == 1  # at least 1
    assert r(0, 10, 128, cpu_count=16) == 1  # 10 prompts: concurrency 10
    assert r(3, 100, 2) == 2 and r(8, 4, None) == 4  # never above the concurrency
    assert r(1, 1000, 128) == 1
    assert parse_args(["--max-concurrency", "2"]).client_processes == 0
    with pytest.raises(SystemExit):
        parse_args(["--client-processes", "-1"])

    # a process that fails reports its error (args without --timeout: AttributeError) and
    # the parent raises it instead of waiting
    from benchmarks.bench_serving import Spec
    from benchmarks.serving.client import _Request
    from benchmarks.serving.workers import concurrency_share, run_in_processes

    assert [concurrency_share(7, 3, k) for k in range(3)] == [3, 2, 2]
    assert concurrency_share(None, 3, 0) is None
    args = argparse.Namespace(tokenizer=None, max_concurrency=None)
    reqs = [_Request(i, Spec("hi", 1, 1), 0.0) for i in range(2)]
    with pytest.raises(RuntimeError, match="client process .* failed: AttributeError.*timeout"):
        run_in_processes(args, "http://127.0.0.1:9/v1/completions", "m", reqs, 2)


def test_plot_without_matplotlib_says_how_to_install(monkeypatch, capsys):
    import builtins

    real_import = builtins.__import__

    def fake_import(name, *a, **k):
        if name.startswith("matplotlib"):
            raise ImportError("no matplotlib")
        return real_import(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", fake_import)
    assert main(["--plot", "x.png", "--base-url", "http://127.0.0.1:9"]) != 0
    assert "pip install matplotlib" in capsys.readouterr().err


# -- against the server -------------------------------------------------------------------
def _run(server, *extra: str) -> dict:
    args = parse_args(["--base-url", server.url, "--disable-tqdm", *extra])
    return asyncio.run(run_benchmark(args))


def test_burst_streaming(server, default_model_dir, tmp_path, capsys):
    out = tmp_path / "bench.json"
    argv = [
        "--base-url",
        server.url,
        "--disable-tqdm",
        "--num-prompts",
        "8",
        "--dataset",
        "random",
        "--tokenizer",
        str(default_model_dir),
        "--input-len",
        "32",
        "--output-len",
        "8",
        "--json",
        str(out),
    ]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "Serving Benchmark Result" in printed and "Mean TTFT (ms)" in printed
    res = json.loads(out.read_text())
    assert res["completed"] == 8 and res["failed"] == 0, res["errors"]
    assert res["total_output_tokens"] == 64
    assert res["input_tokens_from_server"] and res["total_input_tokens"] >= 8 * 32
    for key in (
        "mean_ttft_ms",
        "median_ttft_ms",
        "p99_ttft_ms",
        "mean_tpot_ms",
        "p90_tpot_ms",
        "mean_itl_ms",
        "mean_e2el_ms",
    ):
        assert res[key] > 0, key
    assert res["args"]["request_rate"] == "inf" and res["config"]["stream"] is True
    reqs = res["requests"]
    assert [r["index"] for r in reqs] == list(range(8))
    for r in reqs:
        assert r["success"] and r["error"] is None
        assert r["output_tokens"] == 8 and r["output_tokens_from"] == "usage"
        assert 0 < r["ttft_s"] <= r["e2e_s"] and r["prompt_len"] == 32
    ts = res["time_series"]
    widths = np.diff([*ts["t_s"], ts["end_s"]])
    assert float(np.dot(ts["output_tokens_per_s"], widths)) == pytest.approx(64)
    server.wait_idle()


def test_max_concurrency_without_streaming(server, default_model_dir):
    res = _run(
        server,
        "--num-prompts",
        "6",
        "--max-concurrency",
        "2",
        "--no-stream",
        "--tokenizer",
        str(default_model_dir),
        "--input-len",
        "16",
        "--output-len",
        "8",
        "--endpoint",
        "/v1/chat/completions",
    )
    assert res["completed"] == 6 and res["failed"] == 0, res["errors"]
    assert res["total_output_tokens"] == 48
    assert res["max_concurrent_requests"] <= 2
    assert res["mean_ttft_ms"] is None and res["mean_e2el_ms"] > 0
    assert all(r["output_tokens_from"] == "usage" for r in res["requests"])


def test_fixed_submit_interval(server):
    n, interval = 5, 0.050
    res = _run(
        server,
        "--num-prompts",
        str(n),
        "--submit-interval-ms",
        "50",
        "--dataset",
        "fixed",
        "--prompt",
        "Hello there",
        "--output-len",
        "4",
    )
    assert res["completed"] == n and res["failed"] == 0, res["errors"]
    sent = [r["sent_s"] for r in sorted(res["requests"], key=lambda r: r["index"])]
    # the schedule is absolute: request i never leaves before t0 + i * 50 ms ...
    for i, t in enumerate(sent):
        assert t >= i * interval, (i, sent)
    # ... and successive submissions are 50 ms apart (less the few ms by which an earlier one
    # could have been late on a busy event loop)
    gaps = np.diff(sent)
    assert gaps.min() >= interval - 0.015, sent
    assert sent[-1] - sent[0] >= (n - 1) * interval - 0.015
    assert math.isclose(res["config"]["submit_interval_ms"], 50.0)


def test_two_client_processes(server, default_model_dir):
    n, c = 12, 4
    res = _run(
        server,
        "--client-processes",
        "2",
        "--num-prompts",
        str(n),
        "--max-concurrency",
        str(c),
        "--submit-interval-ms",
        "20",
        "--tokenizer",
        str(default_model_dir),
        "--input-len",
        "16",
        "--output-len",
        "8",
        "--range-ratio",
        "0.5",
    )
    assert res["completed"] == n and res["failed"] == 0, res["errors"]
    assert res["config"]["client_processes"] == 2 and res["config"]["max_concurrency"] == c
    reqs = res["requests"]
    assert [r["index"] for r in reqs] == list(range(n))
    assert [r["scheduled_s"] for r in reqs] == pytest.approx([i * 0.020 for i in range(n)])
    assert len({r["output_len"] for r in reqs}) > 1  # the lengths vary, so a mix-up would show
    for r in reqs:
        assert r["output_tokens"] == r["output_len"] and r["output_tokens_from"] == "usage"
        assert r["sent_s"] >= r["scheduled_s"] - 1e-6, r  # one t0 shared by both processes
        assert 0 < r["ttft_s"] <= r["e2e_s"] and r["end_s"] <= res["duration_s"] + 1e-6
    assert res["total_output_tokens"] == sum(r["output_len"] for r in reqs)
    assert 1 <= res["max_concurrent_requests"] <= c
    ts = res["time_series"]
    widths = np.diff([*ts["t_s"], ts["end_s"]])
    assert float(np.dot(ts["output_tokens_per_s"], widths)) == pytest.approx(
        res["total_output_tokens"]
    )
    server.wait_idle()


def test_failed_requests_and_a_server_that_is_not_there(server, capsys):
    """A reply that is not 200 is a failed request with its status and text (streamed and
    not), and a server that is not listening is one error line and exit status 1."""
    for stream in ([], ["--no-stream"]):
        res = _run(
            server,
            "--num-prompts",
            "2",
            "--model",
            "no-such-model",
            "--output-len",
            "4",
            "--warmup-requests",
            "0",
            *stream,
        )
        assert res["completed"] == 0 and res["failed"] == 2
        (err,) = res["errors"]
        assert err["count"] == 2 and err["error"].startswith("HTTP 404: "), err
        assert "no-such-model" in err["error"]
    # a prompt past the model's context: refused at intake (HTTP 400), before any stream
    res = _run(
        server,
        "--num-prompts",
        "1",
        "--dataset",
        "fixed",
        "--prompt",
        "word " * 20_000,
        "--output-len",
        "4",
        "--warmup-requests",
        "0",
    )
    assert res["failed"] == 1 and res["errors"][0]["error"].startswith("HTTP 400: ")
    rc = main(["--base-url", "http://127.0.0.1:9", "--disable-tqdm", "--num-prompts", "1"])
    assert rc == 1
    assert capsys.readouterr().err.startswith("error: http://127.0.0.1:9: ")
