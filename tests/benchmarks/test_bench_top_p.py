"""benchmarks/bench_top_p.py's plumbing (the GPU check's stage 9b): every step runs on the
sampler's own column types, each line prints its figures, and the new thresholds equal the
float64 sort's (`exact True`) on both kinds of rows."""

from __future__ import annotations

import re

from tests.benchmarks import run_bench


def test_bench_top_p_runs_every_step_and_is_exact():
    out = run_bench(
        "bench_top_p.py", "--shapes", "16x4096,8x20000", "--repeat", "1", "--threads", "1"
    )
    lines = re.findall(r"^cpu (\d+x\d+) (chat|flat): (.*) ms \| exact (\w+)", out, re.M)
    assert [(s, d) for s, d, _, _ in lines] == [
        ("16x4096", "chat"),
        ("16x4096", "flat"),
        ("8x20000", "chat"),
        ("8x20000", "flat"),
    ], out
    for _, _, figures, exact in lines:
        steps = dict(re.findall(r"([a-z_ 0-9]+?) ([\d.]+)(?:  |$)", figures))
        assert set(steps) == {"old sort", "old cpu", "new", "new radix", "sampling_probs"} | {
            "topk256"
        }, figures
        assert exact == "True"
