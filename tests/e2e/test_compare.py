"""benchmarks/compare.py: the check and table logic on made-up rows, then tiny real runs in a
subprocess: every row (a stand-in llama-server script for row e, since the real binary is
not installed here), and rows that fail (a server that cannot start, a llama-server that
exits) reported as errors while the comparison goes on."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from benchmarks.compare import busy_delta, evaluate_checks, format_table, parse_args, parse_metrics
from benchmarks.comparison.checks import FORWARD_TARGET, THROUGHPUT_TARGET, TTFT_SLACK_MS
from tests.e2e.conftest import REPO

pytestmark = pytest.mark.timeout(180)

TINY = [
    "--num-requests",
    "4",
    "--concurrency",
    "4",
    "--input-len",
    "32",
    "--output-len",
    "8",
    "--single-requests",
    "2",
    "--single-output-len",
    "4",
]

# A stand-in for llama.cpp's llama-server: its flags, /health, /v1/models and streamed
# /v1/completions with a final usage chunk; writes the argv it got next to itself.
FAKE_LLAMA = """\
    import argparse, json, os, signal, sys
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    from pathlib import Path

    Path(__file__).with_suffix(".argv").write_text(json.dumps(sys.argv[1:]))
    p = argparse.ArgumentParser()
    for flag in ("-m", "--host", "--port", "-np", "-c", "-t"):
        p.add_argument(flag, required=True)
    a = p.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))

    class H(BaseHTTPRequestHandler):
        def log_message(self, *_):
            pass

        def send_json(self, obj, code=200):
            data = json.dumps(obj).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            if self.path == "/health":
                self.send_json({"status": "ok"})
            elif self.path == "/v1/models":
                self.send_json({"object": "list", "data": [{"id": "fake.gguf"}]})
            else:
                self.send_json({"error": "not found"}, 404)

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if self.path != "/v1/completions" or not body.get("ignore_eos") or not body["stream"]:
                return self.send_json({"error": {"message": "unexpected request"}}, 400)
            n = body["max_tokens"]
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            for i in range(n):
                chunk = {"choices": [{"index": 0, "text": " x",
                                      "finish_reason": "length" if i == n - 1 else None}]}
                self.wfile.write(f"data: {json.dumps(chunk)}\\n\\n".encode())
                self.wfile.flush()
            usage = {"prompt_tokens": len(body["prompt"].split()), "completion_tokens": n}
            self.wfile.write(f"data: {json.dumps({'choices': [], 'usage': usage})}\\n\\n".encode())
            self.wfile.write(b"data: [DONE]\\n\\n")

    ThreadingHTTPServer((a.host, int(a.port)), H).serve_forever()
"""


def write_script(path: Path, body: str) -> Path:
    path.write_text(f"#!{sys.executable}\n" + textwrap.dedent(body))
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def run_compare(tmp_path: Path, *extra: str, timeout: float = 170) -> tuple[int, str, dict]:
    out = tmp_path / "compare.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "benchmarks" / "compare.py"),
            *TINY,
            *extra,
            "--json",
            str(out),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )
    assert out.exists(), proc.stdout + proc.stderr[-4000:]
    return proc.returncode, proc.stdout + proc.stderr, json.loads(out.read_text())


# -- no process ---------------------------------------------------------------------------
def test_busy_delta_from_metrics_text():
    def text(fwd, sample, sched, ipc):
        rows = [("forward", fwd), ("sample", sample), ("schedule", sched), ("ipc", ipc)]
        return (
            "# HELP x\n"
            + "".join(
                f'zeroserve:scheduler_busy_seconds_total{{part="{p}"}} {v}\n' for p, v in rows
            )
            + "zeroserve:num_requests_running 0.0\n"
        )

    before = parse_metrics(text(1.0, 0.1, 0.1, 0.1))
    after = parse_metrics(text(10.0, 0.3, 0.2, 0.6))
    assert before["zeroserve:num_requests_running"] == 0.0
    d = busy_delta(before, after)
    assert d["seconds"] == pytest.approx(
        {"forward": 9.0, "sample": 0.2, "schedule": 0.1, "ipc": 0.5}
    )
    assert d["forward_share"] == pytest.approx(9.0 / 9.8)
    assert busy_delta(before, before)["forward_share"] is None  # no busy time: no share


def _rows(server_tps=95.0, share=0.95, ttft=60.0, prefill=50.0):
    return [
        {
            "key": "offline",
            "label": "a",
            "name": "offline",
            "status": "ok",
            "output_tok_s": 100.0,
            "prefill": {"mean_ms": prefill},
        },
        {
            "key": "server_w4",
            "label": "b",
            "name": "server --tokenize-workers 4",
            "status": "ok",
            "output_tok_s": server_tps,
            "forward_share": share,
            "busy": {"shares": {"forward": share, "ipc": 1 - share}},
            "ttft_p50_ms": ttft,
        },
    ]


def test_checks_pass_fail_skip():
    assert [c["status"] for c in evaluate_checks(_rows())] == ["PASS", "PASS", "PASS"]
    fails = evaluate_checks(_rows(server_tps=89.0, share=0.89, ttft=65.5))
    assert [c["status"] for c in fails] == ["FAIL", "FAIL", "FAIL"]
    assert fails[0]["value"] == pytest.approx(0.89) and fails[2]["value"] == pytest.approx(15.5)
    no_offline = _rows()
    no_offline[0] = {
        "key": "offline",
        "label": "a",
        "name": "offline",
        "status": "skipped",
        "reason": "--skip-offline",
    }
    assert [c["status"] for c in evaluate_checks(no_offline)] == ["SKIP", "PASS", "SKIP"]
    broken = _rows()
    broken[1] = {**broken[1], "status": "error", "error": "boom"}
    checks = evaluate_checks(broken)
    assert [c["status"] for c in checks] == ["SKIP"] * 3
    assert "(b) did not run" in checks[0]["detail"]
    assert [c["status"] for c in evaluate_checks(_rows()[:1])] == ["SKIP"] * 3
    # paired one-at-a-time figures win over row (a)'s prefill measured minutes earlier
    paired = _rows(ttft=200.0, prefill=50.0)
    paired[1]["paired_ttft"] = {
        "median_overhead_ms": 9.0,
        "median_ttft_ms": 200.0,
        "median_prefill_ms": 191.0,
    }
    check = evaluate_checks(paired)[2]
    assert check["status"] == "PASS" and check["value"] == 9.0 and "paired" in check["detail"]
    paired[1]["paired_ttft"]["median_overhead_ms"] = 15.5
    assert evaluate_checks(paired)[2]["status"] == "FAIL"


def test_table_shows_errors_and_skips():
    rows = _rows()
    rows[0].update(
        dtype="bfloat16",
        ratio_to_offline=1.0,
        ttft_p50_ms=50.0,
        prefill={"mean_ms": 50.0, "runs": 3},
    )
    rows[1]["ratio_to_offline"] = 0.95
    rows.append(
        {
            "key": "hf",
            "label": "c",
            "name": "transformers generate",
            "status": "error",
            "error": "RuntimeError: out of memory\nmore",
        }
    )
    rows.append(
        {
            "key": "llama_server",
            "label": "d",
            "name": "llama.cpp llama-server",
            "status": "skipped",
            "reason": "llama-server not on PATH",
        }
    )
    res = {
        "workload": {
            "num_requests": 64,
            "input_tokens_min": 128,
            "input_tokens_max": 128,
            "output_len": 128,
            "single_requests": 10,
            "single_output_len": 16,
        },
        "args": vars(parse_args([])),
        "machine": {"cpu": "x", "threads": 2, "torch": "t"},
        "rows": rows,
        "checks": evaluate_checks(rows),
        "cpu_busy_before": 0.02,
        "cpu_busy_after": None,
    }
    table = format_table(res)
    assert "warning: other processes" not in table
    assert "warning: other processes kept the CPUs busy (60% before the run" in format_table(
        {**res, "cpu_busy_before": 0.6}
    )
    assert "ERROR: RuntimeError: out of memory" in table and "more" not in table
    assert "skipped: llama-server not on PATH" in table
    assert "0.95x" in table and "95.0%" in table and "50.0 ms *" in table
    assert table.count("PASS") == 3


# -- tiny real runs -----------------------------------------------------------------------
def test_compare_every_row(tmp_path, default_model_dir):
    fake = write_script(tmp_path / "llama-server", FAKE_LLAMA)
    code, out, res = run_compare(
        tmp_path,
        "--workers-list",
        "1",
        "--hf-batch",
        "4",
        "--llama-server",
        str(fake),
        "--llama-threads",
        "2",
    )
    assert code == 0, out[-4000:]
    rows = {r["key"]: r for r in res["rows"]}
    assert list(rows) == ["offline", "server_w1", "hf", "llama_server"]
    assert [r["label"] for r in res["rows"]] == ["a", "b", "c", "d"]
    for r in rows.values():
        assert r["status"] == "ok", r.get("traceback") or r
        assert r["output_tok_s"] > 0 and r["ttft_p50_ms"] > 0
    assert rows["offline"]["ratio_to_offline"] == 1.0
    assert rows["offline"]["main"]["output_tokens"] == 4 * 8
    assert rows["offline"]["prefill"]["runs"] == 2
    assert rows["offline"]["prefill"]["num_cached_tokens"] == [0, 0]
    server = rows["server_w1"]
    assert server["main"]["completed"] == 4 and server["main"]["total_output_tokens"] == 32
    assert server["single"]["completed"] == 2 and server["single"]["total_output_tokens"] == 8
    pt = server["paired_ttft"]  # each server request right after an in-process prefill of it
    assert len(pt["prefill_ms"]) == len(pt["ttft_ms"]) == 2 and min(pt["prefill_ms"]) > 0
    assert pt["overhead_ms"] == pytest.approx(
        [t - p for t, p in zip(pt["ttft_ms"], pt["prefill_ms"])]
    )
    assert server["ttft_p50_ms"] == pytest.approx(pt["median_ttft_ms"])
    assert server["exit_code"] == 0 and server["warnings"] == []
    assert 0 < server["forward_share"] <= 1
    assert set(server["busy"]["seconds"]) == {"forward", "sample", "schedule", "ipc"}
    assert server["metrics_delta"]["zeroserve:generation_tokens_total"] == 32
    single = server["single_metrics_delta"]  # distinct prompts: a real prefill each time
    assert single["zeroserve:generation_tokens_total"] == 8
    assert single["zeroserve:prefix_cache_hits_total"] == 0
    assert "--tokenize-workers" in server["command"]
    cmd = server["command"]  # like for like with llama-server: no drafts
    assert cmd[cmd.index("--speculative-method") + 1] == "none"
    assert rows["hf"]["batch"] == 4 and rows["hf"]["main"]["output_tokens"] == 32
    llama = rows["llama_server"]
    assert llama["model"] == "fake.gguf" and llama["main"]["total_output_tokens"] == 32
    argv = json.loads(fake.with_suffix(".argv").read_text())
    from common.model_files.model_source import default_gguf_path

    flags = dict(zip(argv[::2], argv[1::2]))
    assert flags["-m"] == str(default_gguf_path())
    assert flags["-np"] == "4" and flags["-t"] == "2"
    assert int(flags["-c"]) == 4 * llama["ctx_per_slot"] and llama["ctx_per_slot"] >= 32 + 8
    assert [c["name"] for c in res["checks"]] == [
        "server_throughput",
        "forward_share",
        "ttft_overhead",
    ]
    # each verdict is the row's own figures against its target (recomputed here): a
    # check that skipped, judged the wrong figure or the wrong way round fails
    ratio = server["output_tok_s"] / rows["offline"]["output_tok_s"]
    share, over = server["forward_share"], server["paired_ttft"]["median_overhead_ms"]
    for check, (value, passed) in zip(
        res["checks"],
        [
            (ratio, ratio >= THROUGHPUT_TARGET),
            (share, share >= FORWARD_TARGET),
            (over, over <= TTFT_SLACK_MS),
        ],
        strict=True,
    ):
        assert check["value"] == pytest.approx(value), check
        assert check["status"] == ("PASS" if passed else "FAIL"), check
    assert res["machine"]["threads"] >= 1 and res["args"]["workers_list"] == "1"
    assert res["argv"][: len(TINY)] == TINY
    for line in (
        "a  offline engine",
        "b  server --tokenize-workers 1",
        "c  transformers",
        "d  llama.cpp llama-server",
        "target checks:",
    ):
        assert line in out


def test_failed_rows_are_reported_not_fatal(tmp_path, default_model_dir):
    dead = write_script(tmp_path / "llama-server", "import sys\nsys.exit(3)\n")
    # max_num_batched_tokens 0 is a config error: launch.py exits before serving
    code, out, res = run_compare(
        tmp_path,
        "--skip-offline",
        "--skip-hf",
        "--workers-list",
        "1",
        "--engine-args",
        "--max-num-batched-tokens 0",
        "--llama-server",
        str(dead),
        "--startup-timeout",
        "60",
        timeout=120,
    )
    assert code == 1, out[-4000:]
    rows = {r["key"]: r for r in res["rows"]}
    assert rows["offline"]["status"] == "skipped" and rows["hf"]["status"] == "skipped"
    assert rows["server_w1"]["status"] == "error"
    assert "exited with code 2" in rows["server_w1"]["error"]
    assert "max_num_batched_tokens" in rows["server_w1"]["error"]  # the log tail says why
    assert "max_num_batched_tokens" in rows["server_w1"]["log_tail"]
    assert rows["server_w1"]["command"][1].endswith("launch.py")
    assert rows["llama_server"]["status"] == "error"
    assert "exited with code 3" in rows["llama_server"]["error"]
    assert [c["status"] for c in res["checks"]] == ["SKIP"] * 3
    assert "ERROR: RuntimeError: exited with code 2" in out


def test_missing_llama_server_is_skipped(tmp_path, monkeypatch):
    from benchmarks.compare import find_llama_server

    monkeypatch.setenv("PATH", str(tmp_path))
    path, why = find_llama_server(parse_args([]))
    assert path is None and "not on PATH" in why
    path, why = find_llama_server(parse_args(["--llama-server", str(tmp_path / "nope")]))
    assert path is None and "not an executable" in why
    exe = write_script(tmp_path / "llama-server", "pass\n")
    assert find_llama_server(parse_args([]))[0] == str(exe)
    assert os.access(exe, os.X_OK)
