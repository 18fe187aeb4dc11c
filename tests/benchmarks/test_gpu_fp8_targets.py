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


def _fp8_verdicts(rows: dict) -> dict[str, str]:
    return {t["target"]: t["verdict"] for t in targets.targets({}, rows) if "FP8" in t["target"]}


def test_fp8_targets_from_the_speed_rows():
    rows = {
        "l1b": {"tok_s_256": 60000.0},
        "l1b_fp8": {"tpot_1_ms": 0.61, "tok_s_256": 75000.0},
        "l8b_fp8": {"tpot_1_ms": 3.2},
    }
    got = _fp8_verdicts(rows)
    assert list(got.values()) == ["PASS", "PASS", "FAIL"]
    rows["l1b_fp8"]["tok_s_256"] = 70000.0  # 1.17x
    assert list(_fp8_verdicts(rows).values())[1] == "FAIL"
    assert set(_fp8_verdicts({}).values()) == {"n/a "}  # no FP8 server ran


def test_fp8_servers_are_in_the_speed_table():
    row = summarize.speed_row("l1b_fp8", {"bench": {"1": {"tpot_med_ms": 0.6}}}, {})
    assert row["tpot_1_ms"] == 0.6
    assert {"l1b_fp8", "l8b_fp8"} <= set(summarize.SPEED_TAGS)


def test_gpu_check_script_parses():
    script = GPU.parent / "gpu_check.sh"
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    text = script.read_text()
    assert "serve l1b_fp8" in text and "serve l8b_fp8" in text
