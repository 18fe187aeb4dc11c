"""benchmarks/compare_files.py: one command runs our server and a llama-server (the
stand-in script of test_compare, since the real binary is not installed here) on each
file, one after the other; a file our server refuses is reported in the table while
llama-server still runs on it. And the tensor-type census against gguf-py's own counts."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from benchmarks.comparison.file_table import format_files
from benchmarks.comparison.gguf_types import read_types
from tests.e2e.conftest import REPO
from tests.e2e.test_compare import FAKE_LLAMA, write_script

pytestmark = pytest.mark.timeout(900)  # a zeroserve start on a loaded 2-core machine


def write_unknown_arch_gguf(path):
    """A small valid GGUF of an architecture no server knows (and two tensor types)."""
    import gguf

    w = gguf.GGUFWriter(str(path), "nosucharch")
    w.add_tensor("token_embd.weight", np.ones((8, 4), dtype=np.float16))
    w.add_tensor("blk.0.attn_norm.weight", np.ones(4, dtype=np.float32))
    w.add_tensor("blk.0.attn_q.weight", np.ones((4, 4), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_tensor_types_of_a_written_file(tmp_path):
    f = read_types(write_unknown_arch_gguf(tmp_path / "x.gguf"))
    assert f.arch == "nosucharch"
    assert {t: (s.count, s.bytes) for t, s in f.per_type.items()} == {
        "F16": (1, 8 * 4 * 2),
        "F32": (2, 4 * 4 + 4 * 4 * 4),
    }
    assert dict(f.per_type["F32"].roles) == {"norm/bias": 1, "linear": 1}
    assert dict(f.per_type["F16"].roles) == {"embedding": 1}
    assert f.tensor_bytes == 64 + 16 + 64 and f.quantized_bytes == 0
    assert f.file_bytes > f.tensor_bytes


def test_no_long_prompts_when_none_asked(tmp_path, default_model_dir):
    from argparse import Namespace

    from benchmarks.comparison.per_file import FilePrompts

    args = Namespace(
        seed=0, stream_list=[1, 2], min_requests=2, input_len=16, long_requests=0, long_len=64
    )
    p = FilePrompts(args, default_model_dir, tmp_path)
    assert len(p.short) == 2 and p.long == [] and p.long_tokens == []


def test_compare_files_runs_both_servers_per_file(tmp_path, default_model_dir):
    fake = write_script(tmp_path / "llama-server", FAKE_LLAMA)
    unknown = write_unknown_arch_gguf(tmp_path / "unknown.gguf")
    out = tmp_path / "files.json"
    argv = [
        *("--llama-server", str(fake), "--file", "smollm2", "--file", str(unknown)),
        *("--streams", "1,2", "--min-requests", "2", "--input-len", "16", "--output-len", "4"),
        *("--long-len", "64", "--long-requests", "2", "--llama-np", "2", "--threads", "2"),
        *("--json", str(out), "--llama-first"),
    ]
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "compare_files.py"), *argv],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=850,
        stdin=subprocess.DEVNULL,
    )
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, text[-4000:]
    res = json.loads(out.read_text())
    default, refused = res["files"]
    from common.model_files.model_source import default_gguf_path

    assert default["file"] == str(default_gguf_path())
    assert default["arch"] == "llama" and default["file_type"] == "Q4_1"
    assert set(default["tensor_types"]) == {"F32", "Q4_1", "Q8_0"}
    assert default["tensor_types"]["Q8_0"]["roles"] == {"embedding": 1}
    z, ll = default["zeroserve"], default["llama_server"]
    for row in (z, ll):
        assert row["status"] == "ok", row
        assert set(row["streams"]) == {"1", "2"}
        for c in row["streams"].values():
            assert c["failed"] == 0 and c["output_tokens"] == 2 * 4 and c["output_tok_s"] > 0
        assert len(row["long"]["ttft_ms"]) == 2 and row["long"]["failed"] == 0
        assert row["startup_s"] > 0 and row["warnings"] == []
    assert min(z["long"]["server_prompt_tokens"]) >= 60  # ~64-token windows, as counted
    # zeroserve's processes worked for those tokens (the stand-in llama may take < 1 tick)
    assert all(c["cpu_s"] > 0 for c in z["streams"].values())
    for c in z["streams"].values():  # and by process: launch.py's children by their module
        by = c["cpu_s_by_process"]
        assert {"scheduler_worker", "frontend", "detok_worker"} <= set(by), by
        assert sum(by.values()) == pytest.approx(c["cpu_s"], abs=0.1)
        assert c["client_cpu_s"] > 0
    for c in ll["streams"].values():  # the stand-in llama-server: one program
        assert set(c["cpu_s_by_process"]) == {"llama-server"}
    split = [line for line in text.splitlines() if "CPU s, zeroserve:" in line]
    assert split and all("scheduler_worker" in x and "the client" in x for x in split), text
    (sched,) = z["memory"].values()  # one scheduler replica
    assert sched["rss"] > default["tensor_bytes"] and sched["peak_rss"] >= sched["rss"]
    assert z["launch_startup_s"] is not None and z["exit_code"] == 0
    assert default["order"] == "llama-server first"  # --llama-first: llama-server measured first
    assert ll["started_at"] < z["started_at"]
    assert len(res["loadavg_before"]) == 3 and len(default["loadavg_after"]) == 3
    # the file zeroserve cannot serve: its error in the row, llama-server still measured
    assert refused["zeroserve"]["status"] == "error"
    assert "nosucharch" in refused["zeroserve"]["error"]
    assert refused["llama_server"]["status"] == "ok"
    assert any("smollm2's tokenizer" in n for n in refused["notes"])
    flags = json.loads(fake.with_suffix(".argv").read_text())  # the last llama-server
    got = dict(zip(flags[::2], flags[1::2]))
    assert got["-m"] == str(unknown) and got["-np"] == "2" and got["-t"] == "2"
    assert int(got["-c"]) % 256 == 0 and int(got["-c"]) >= 2 * (64 + 8)
    table = format_files(res)
    assert (
        "output tok per CPU s, 2" in table
        and "output tok/s, 2 stream(s)" in table
        and "| unknown.gguf |" in table
    )
    assert "zeroserve: ERROR" in table
    assert "llama-server first; load average" in table and "Load average (1/5/15 min)" in table
    assert text.count("| SmolLM2-135M-Instruct.Q4_1.gguf |") == 1
