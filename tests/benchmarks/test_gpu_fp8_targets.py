"""The GPU check's FP8 plumbing on the CPU: the l1b_fp8 / l8b_fp8 servers' rows reach the
speed table and the issue's FP8 targets get their verdicts (the figures come from a GPU
run of benchmarks/gpu_check.sh); the script still parses."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

GPU = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu"
sys.path.insert(0, str(GPU))  # the GPU check's scripts import each other by name

import summarize  # noqa: E402
import targets  # noqa: E402


def _fp8_verdicts(rows: dict, models: dict | None = None) -> dict[str, str]:
    got = targets.targets(models or {}, rows)
    return {t["target"]: t["verdict"] for t in got if "fp8" in t["target"].lower()}


def test_fp8_targets_from_the_speed_rows():
    rows = {
        "l1b": {"tok_s_256": 60000.0},
        "l1b_fp8": {"tpot_1_ms": 0.61, "tok_s_256": 75000.0},
        "l8b_fp8": {"tpot_1_ms": 3.2},
    }
    models = {"l1b": {"kv_pool_tokens": 100000}, "l1b_fp8": {"kv_pool_tokens": 205000}}
    got = _fp8_verdicts(rows, models)
    assert list(got.values()) == ["PASS", "PASS", "PASS", "FAIL"]
    rows["l1b_fp8"]["tok_s_256"] = 70000.0  # 1.17x
    models["l1b_fp8"]["kv_pool_tokens"] = 180000  # 1.8x
    assert list(_fp8_verdicts(rows, models).values())[:3] == ["FAIL", "PASS", "FAIL"]
    assert set(_fp8_verdicts({}).values()) == {"n/a "}  # no FP8 server ran


def test_kv_pool_tokens_from_the_server_log(tmp_path):
    log = tmp_path / "server_l1b_fp8.log"
    log.write_text(
        "12:00:01 I zeroserve.cuda: GPU memory: 139.8 GiB total x 0.90 utilization: weights "
        "1.50 GiB, largest step 2.10 GiB (8192 prompt tokens, logits of 256 rows), others "
        "0.60 GiB -> KV pool 121.62 GiB, 249077 blocks of 16 tokens (3985232 tokens)\n"
    )
    assert summarize.kv_pool_tokens(log) == 3985232
    assert summarize.kv_pool_tokens(tmp_path / "none.log") is None


def test_fp8_servers_are_in_the_speed_table():
    row = summarize.speed_row("l1b_fp8", {"bench": {"1": {"tpot_med_ms": 0.6}}}, {})
    assert row["tpot_1_ms"] == 0.6
    assert {"l1b_fp8", "l8b_fp8"} <= set(summarize.SPEED_TAGS)


def test_gpu_check_script_parses():
    script = GPU.parent / "gpu_check.sh"
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    text = script.read_text()
    assert "serve l1b_fp8" in text and "serve l8b_fp8" in text
