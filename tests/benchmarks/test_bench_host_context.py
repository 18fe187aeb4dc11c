"""benchmarks/bench_host_context.py's plumbing: two engines of different prompt lengths
stepped in turn in one process, each decoding every row a step, each timed."""

from __future__ import annotations

import shutil

from benchmarks import bench_host_context, bench_host_step


def test_the_lengths_step_in_turn_and_each_is_timed(tiny_llama_dir, tmp_path, monkeypatch):
    model_dir = tmp_path / "tiny-llama"
    shutil.copytree(tiny_llama_dir, model_dir)  # its config takes the longer contexts here
    bench_host_step.fit_positions(model_dir, 100 + bench_host_step.OUT_ROOM)
    monkeypatch.setattr(bench_host_step, "PROMPT_LEN", bench_host_step.PROMPT_LEN)
    rows: dict[int, list[int]] = {}
    real = bench_host_step.start_requests

    def start(engine, publish, n, mix, prompt_len):
        real(engine, publish, n, mix, prompt_len)
        rows[prompt_len] = [len(r.token_ids) for r in engine.requests.values()]

    monkeypatch.setattr(bench_host_step, "start_requests", start)
    got = bench_host_context.interleaved(model_dir, 4, [20, 100], 6)
    assert sorted(got) == [20, 100]
    for n, figures in got.items():
        assert figures["step"] > 0 and figures["publish"] > 0
        assert figures["all"] == figures["step"] + figures["publish"]
        assert len(rows[n]) == 4 and all(n < t <= n + 20 for t in rows[n])  # each its length
