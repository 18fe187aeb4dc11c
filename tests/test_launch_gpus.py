"""launch.py's GPU placement as a user meets it, on a CPU with a stand-in GPU count
(ZEROSERVE_STANDIN_GPU_COUNT): more GPUs asked for than are visible is one line and exit
2 before anything starts; each replica is spawned with its own CUDA_VISIBLE_DEVICES, and
a replica that dies is restarted with the same one.

Run as `python -m tests.test_launch_gpus --config FILE --replica-id K` it is the stand-in
replica those tests spawn: it writes down its environment's GPUs and exits 3."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

import launch
from common.config import Config
from tests.test_launch_checks import free_ports

pytestmark = pytest.mark.timeout(120)
ROOT = Path(__file__).resolve().parents[1]


def run_launch(*argv: str, gpus: int) -> subprocess.CompletedProcess:
    env = {**os.environ, "ZEROSERVE_STANDIN_GPU_COUNT": str(gpus)}
    env.pop("CUDA_VISIBLE_DEVICES", None)
    (port,) = free_ports(1)
    return subprocess.run(
        [sys.executable, str(ROOT / "launch.py"), "--port", str(port), *argv],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def test_more_replicas_than_gpus_is_refused_in_one_line_before_anything_starts():
    run = run_launch("--device", "cuda", "--dp", "3", gpus=2)
    assert run.returncode == 2, run.stderr[-2000:]
    assert run.stdout == ""
    assert run.stderr.splitlines() == [
        "launch.py: --data-parallel-size 3 needs 3 GPU(s) (1 per replica); 2 visible (0, 1)"
    ]
    run = run_launch("--device", "cuda", "--dp", "2", "--gpu-ids", "1,4", gpus=4)
    assert run.returncode == 2 and run.stderr.splitlines() == [
        "launch.py: --gpu-ids 1,4: GPU 4 is not visible (4 GPU(s) visible: 0, 1, 2, 3)"
    ]


def test_gpu_ids_on_the_cpu_is_refused_in_one_line():
    run = run_launch("--device", "cpu", "--gpu-ids", "0", gpus=2)
    assert run.returncode == 2 and run.stderr.splitlines() == [
        "launch.py: --gpu-ids 0: the replicas run on the CPU here (--device cpu); "
        "--device cuda places them on GPUs"
    ]


def seen_by_replicas(folder: Path, count: int, timeout_s: float = 30) -> list[dict]:
    deadline = time.monotonic() + timeout_s
    path = folder / "replicas.jsonl"
    while time.monotonic() < deadline:
        lines = path.read_text().splitlines() if path.exists() else []
        if len(lines) >= count:
            return [json.loads(line) for line in lines]
        time.sleep(0.05)
    raise AssertionError(f"{count} replica starts not seen in {timeout_s} s")


def test_each_replica_gets_its_gpu_and_keeps_it_when_restarted(tmp_path, monkeypatch):
    """launch.py's Launcher with its real spawn and reap: replica K of `--dp 2 --gpu-ids
    2,3` on 4 GPUs starts with CUDA_VISIBLE_DEVICES=2+K; each dies, is restarted, and the
    new process has the same GPU."""
    monkeypatch.setenv("ZEROSERVE_STANDIN_GPU_COUNT", "4")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")  # launch.py's own: not inherited
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    base = Config(data_parallel_size=2, gpu_ids="2,3")
    config = replace(
        base, engine=replace(base.engine, model=replace(base.engine.model, device="cuda"))
    )
    placed = launch.plan_gpus(config, None)
    assert placed == [["2"], ["3"]]
    launcher = launch.Launcher(config, tmp_path / "config.json", placed)
    replicas = [c for c in launcher.children if c.module == "scheduler_worker"]
    for child in replicas:
        child.module = "tests.test_launch_gpus"  # this file's stand-in replica
        launcher.spawn(child)
    try:
        first = seen_by_replicas(tmp_path, 2)
        for child in replicas:
            assert child.proc is not None
            child.proc.wait(timeout=30)
        assert launcher.reap()  # both died (exit 3): restarted
        both = seen_by_replicas(tmp_path, 4)
    finally:
        for child in replicas:
            if child.proc is not None and child.proc.poll() is None:
                child.proc.kill()
    gpus = {}
    for seen in both:
        gpus.setdefault(seen["replica"], []).append((seen["gpus"], seen["pid"]))
    assert {k: [g for g, _ in v] for k, v in gpus.items()} == {"0": ["2", "2"], "1": ["3", "3"]}
    assert all(v[0][1] != v[1][1] for v in gpus.values())  # new processes, same GPUs
    assert {s["replica"] for s in first} == {"0", "1"}
    assert all(c.gpus is None for c in launcher.children if c not in replicas)  # replicas only


def main() -> None:
    """The stand-in replica: one line of what it was given, then exit 3 (a death)."""
    args = sys.argv[1:]
    folder = Path(args[args.index("--config") + 1]).parent
    seen = {
        "replica": args[args.index("--replica-id") + 1],
        "gpus": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "pid": os.getpid(),
    }
    with open(folder / "replicas.jsonl", "a") as f:
        f.write(json.dumps(seen) + "\n")
    sys.exit(3)


if __name__ == "__main__":
    main()
