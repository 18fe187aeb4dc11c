"""Preemption through the server: a KV pool of 16 blocks (256 tokens) under 8 concurrent
greedy streams of ~100 tokens each must preempt (recompute) and still give every request
all its tokens, each the text it gets alone, with the preemptions counted in the
requests' usage.timings and in zeroserve:num_preemptions_total. The check is the GPU
check's own client (benchmarks/gpu/client_preempt.py), run here on the CPU."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.e2e.conftest import REPO, served

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def small_pool(default_model_dir):
    yield from served("--num-kv-blocks", "16", "--max-model-len", "256", workers=1)


def test_a_pool_too_small_preempts_and_every_request_ends_whole(small_pool, tmp_path):
    out = tmp_path / "preempt.json"
    run = subprocess.run(
        [sys.executable, "benchmarks/gpu/client.py", "preempt", small_pool.url, str(out)]
        + ["--streams", "8", "--tokens", "64", "--exact", "1"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=240,
    )
    res = json.loads(out.read_text())
    assert run.returncode == 0, (res, run.stdout[-2000:], run.stderr[-2000:])
    assert res["preempt"] == "PASS" and res["errors"] == [] and res["all_tokens"]
    assert res["preemptions"] > 0 and res["metric_preemptions"] == res["preemptions"]
    assert res["equal_alone"] == 8
    # nothing held once idle: every block back in the pool, no request left running
    small_pool.wait_idle(timeout_s=30)
