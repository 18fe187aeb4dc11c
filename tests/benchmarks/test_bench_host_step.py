"""benchmarks/bench_host_step.py's --width: the stand-in logits as wide as asked, every
chat-narrow row's prompt and sampled tokens inside them, and a width outside 2-1000
refused before anything runs."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from benchmarks import bench_host_step

REPO = Path(__file__).resolve().parents[2]


def test_the_chat_narrow_rows_sample_inside_the_width(tiny_llama_dir, tmp_path, monkeypatch):
    model_dir = tmp_path / "tiny-llama"
    shutil.copytree(tiny_llama_dir, model_dir)
    bench_host_step.fit_positions(model_dir, bench_host_step.PROMPT_LEN + bench_host_step.OUT_ROOM)
    monkeypatch.setattr(bench_host_step, "VOCAB", 8)
    engine = bench_host_step.engine_for(model_dir, 16, mix="chat-narrow")
    assert engine.runner.execute.logits.shape == (16, 8)
    publish = bench_host_step.publisher(engine)
    bench_host_step.start_requests(engine, publish, 16, "chat-narrow", 6)
    for _ in range(4):
        publish(engine.step_rows())
    reqs = list(engine.requests.values())
    assert len(reqs) == 16 and all(r.num_output_tokens >= 6 for r in reqs)
    for r in reqs:
        assert all(0 < t < 8 for t in r.prompt_token_ids)
        resolved = [t for t in r.output_token_ids if t >= 0]
        assert resolved and all(t < 8 for t in resolved)


def test_a_width_outside_its_range_is_refused():
    for width in ("1", "1001"):
        out = subprocess.run(
            [sys.executable, "benchmarks/bench_host_step.py", "--width", width],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert out.returncode == 2
        assert "--width must be 2-1000" in out.stderr


def test_the_json_rows_of_a_narrow_mix_follow_their_grammar(tiny_llama_dir, tmp_path, monkeypatch):
    """chat-narrow-json on logits 320 wide: the grammar row (r6 of 16) opens its array of
    strings from byte tokens below the width and stays in its string (as the chat mix's
    rows run on), every token one the grammar allowed."""
    from tokenizers import Tokenizer

    model_dir = tmp_path / "tiny-llama"
    shutil.copytree(tiny_llama_dir, model_dir)
    bench_host_step.fit_positions(model_dir, bench_host_step.PROMPT_LEN + bench_host_step.OUT_ROOM)
    monkeypatch.setattr(bench_host_step, "VOCAB", 320)
    engine = bench_host_step.engine_for(model_dir, 16, mix="chat-narrow-json")
    publish = bench_host_step.publisher(engine)
    added, real_add = {}, engine.add_request

    def add(rid, *args, **kwargs):
        real_add(rid, *args, **kwargs)
        added[rid] = engine.requests[rid]

    monkeypatch.setattr(engine, "add_request", add)
    bench_host_step.start_requests(engine, publish, 16, "chat-narrow-json", 6)
    for _ in range(6):
        publish(engine.step_rows())
    row = added["r6"]
    assert row.params.structured is not None and added["r7"].params.structured is None
    ids = [t for t in row.output_token_ids if t >= 0]
    assert len(ids) >= 6 and all(t < bench_host_step.BYTE_TOKENS for t in ids)
    text = Tokenizer.from_file(str(model_dir / "tokenizer.json")).decode(ids)
    assert text.startswith('["') and text.count('"') == 1, text  # one string, still open
    assert json.loads(text + '"]')[0] == text[2:]  # closed, it parses
