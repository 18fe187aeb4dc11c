"""launch.py's GPU placement as a user meets it, on a CPU with a stand-in GPU count
(ZEROSERVE_STANDIN_GPU_COUNT): more GPUs asked for than are visible is one line and exit
2 before anything starts; each replica is spawned with its own CUDA_VISIBLE_DEVICES, a
replica that dies is restarted with the same one, and one that keeps dying (a broken GPU)
is given up on alone while another serves.

Run as `python -m tests.test_launch_gpus --config FILE --replica-id K` it is the stand-in
replica those tests spawn: it writes down its environment's GPUs, then exits 3 (or, on a
GPU other than $BROKEN_GPU when that is set, serves: sleeps until killed)."""

from __future__ import annotations

import json
import logging
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


def test_tensor_parallel_replicas_get_consecutive_gpu_sets_or_one_line(monkeypatch):
    """`--dp 2 --tp 2`: two replicas of two GPUs each, {0,1} and {2,3} of 4 stand-in GPUs;
    on 2 it is refused in one line before anything starts."""
    monkeypatch.setenv("ZEROSERVE_STANDIN_GPU_COUNT", "4")
    base = Config(data_parallel_size=2)
    model = replace(base.engine.model, device="cuda", tensor_parallel_size=2)
    config = replace(base, engine=replace(base.engine, model=model))
    assert config.gpus_per_replica == 2
    assert launch.plan_gpus(config, None) == [["0", "1"], ["2", "3"]]
    run = run_launch("--device", "cuda", "--dp", "2", "--tp", "2", gpus=2)
    assert run.returncode == 2 and run.stderr.splitlines() == [
        "launch.py: --data-parallel-size 2 needs 4 GPU(s) (2 per replica); 2 visible (0, 1)"
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


def placed_launcher(tmp_path: Path, monkeypatch) -> launch.Launcher:
    """`--device cuda --dp 2 --gpu-ids 2,3` on 4 stand-in GPUs, its replicas this file's."""
    monkeypatch.setenv("ZEROSERVE_STANDIN_GPU_COUNT", "4")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")  # launch.py's own: not inherited
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    base = Config(data_parallel_size=2, gpu_ids="2,3")
    model = replace(base.engine.model, device="cuda")
    config = replace(base, engine=replace(base.engine, model=model))
    placed = launch.plan_gpus(config, None)
    assert placed == [["2"], ["3"]]
    launcher = launch.Launcher(config, tmp_path / "config.json", placed)
    for child in launcher.replicas:
        child.module = "tests.test_launch_gpus"  # this file's stand-in replica
    assert all(c.gpus is None for c in launcher.children if c not in launcher.replicas)
    return launcher


def test_each_replica_gets_its_gpu_and_keeps_it_when_restarted(tmp_path, monkeypatch):
    """launch.py's Launcher with its real spawn and reap: replica K of `--dp 2 --gpu-ids
    2,3` on 4 GPUs starts with CUDA_VISIBLE_DEVICES=2+K; each dies, is restarted, and the
    new process has the same GPU."""
    monkeypatch.delenv("BROKEN_GPU", raising=False)
    launcher = placed_launcher(tmp_path, monkeypatch)
    replicas = launcher.replicas
    for child in replicas:
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


class Lines(logging.Handler):
    """launch.py's log lines, as said (its logger does not propagate to pytest's)."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def test_a_replica_whose_gpu_keeps_failing_is_given_up_alone(tmp_path, monkeypatch):
    """Replica 1's GPU is broken: it dies at every start. After MAX_RESTARTS restarts
    launch.py stops restarting it, says so in one line naming its GPU, and serves on with
    replica 0 (reap stays True); when replica 0 dies too often as well, launch.py gives up."""
    monkeypatch.setattr(launch, "MAX_RESTARTS", 2)
    monkeypatch.setenv("BROKEN_GPU", "3")
    said = Lines()
    logging.getLogger("zeroserve.launch").addHandler(said)
    launcher = placed_launcher(tmp_path, monkeypatch)
    healthy, broken = launcher.replicas
    for child in launcher.replicas:
        launcher.spawn(child)
    try:
        deadline = time.monotonic() + 60
        while not broken.given_up:
            assert time.monotonic() < deadline, "replica 1 never given up"
            assert launcher.reap()  # replica 0 serves: launch.py goes on
            time.sleep(0.05)
        starts = [s["replica"] for s in seen_by_replicas(tmp_path, 4)]
        assert sorted(starts) == ["0", "1", "1", "1"]  # 1 start and 2 restarts of replica 1
        assert healthy.proc is not None and healthy.proc.poll() is None
        time.sleep(0.3)
        assert launcher.reap() and len(seen_by_replicas(tmp_path, 4)) == 4  # not restarted
        lines = [line for line in said.lines if "giving up" in line]
        assert lines == [
            "scheduler-1 (GPU 3) died 3 times within 60 s (last exit code 3); giving up on "
            "it: the other replicas serve on"
        ]
        for _ in range(3):  # the last replica dies too often: the service gives up
            assert healthy.proc is not None
            healthy.proc.kill()
            healthy.proc.wait(timeout=30)
            alive = launcher.reap()
        assert not alive and "scheduler-0 (GPU 2) died 3 times" in said.lines[-1]
    finally:
        logging.getLogger("zeroserve.launch").removeHandler(said)
        for child in launcher.replicas:
            if child.proc is not None and child.proc.poll() is None:
                child.proc.kill()


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
    if os.environ.get("BROKEN_GPU") not in (None, seen["gpus"]):
        time.sleep(600)  # a replica on a good GPU: serves until killed
    sys.exit(3)


if __name__ == "__main__":
    main()
