"""common/gpus.py: replica K on GPUs K*T .. K*T+T-1 of the pool (--gpu-ids, else every
visible GPU), a pool too small refused in one line; the visible GPUs counted without
torch (a stand-in count, CUDA_VISIBLE_DEVICES, nvidia-smi -L); a replica naming its own."""

from __future__ import annotations

import os
import stat
from dataclasses import replace

import pytest

from common import gpus
from common.config import Config, ConfigError
from common.gpus import own_gpus, place_replicas, plan_gpus, replica_gpus, visible_gpus
from common.torch_build import TorchBuild

FOUR = ["0", "1", "2", "3"]
CPU_BUILD = TorchBuild("2.13.0+cpu", None, None)
GPU_BUILD = TorchBuild("2.13.0+cu128", "12.8", None)


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for name in ("ZEROSERVE_STANDIN_GPU_COUNT", "CUDA_VISIBLE_DEVICES"):
        monkeypatch.delenv(name, raising=False)


def test_one_gpu_a_replica_in_order():
    assert place_replicas(2, 1, FOUR, None) == [["0"], ["1"]]
    assert place_replicas(4, 1, FOUR, None) == [["0"], ["1"], ["2"], ["3"]]


def test_t_gpus_a_replica_are_consecutive():
    """Tensor parallelism's shape (T = 2), ready for it: {0,1} and {2,3}."""
    assert place_replicas(2, 2, FOUR, None) == [["0", "1"], ["2", "3"]]
    assert [replica_gpus(k, 4, [str(i) for i in range(8)]) for k in (0, 1)] == [
        ["0", "1", "2", "3"],
        ["4", "5", "6", "7"],
    ]


@pytest.mark.parametrize(
    "num, per, visible, ids, message",
    [
        (3, 1, ["0", "1"], None, "--data-parallel-size 3 needs 3 GPU(s) (1 per replica); 2 visible (0, 1)"),
        (2, 2, ["0", "1"], None, "--data-parallel-size 2 needs 4 GPU(s) (2 per replica); 2 visible (0, 1)"),
        (1, 1, [], None, "--data-parallel-size 1 needs 1 GPU(s) (1 per replica); 0 visible (none)"),
        (3, 1, FOUR, "2,3", "--data-parallel-size 3 needs 3 GPU(s) (1 per replica); --gpu-ids 2,3 gives 2 (2, 3)"),
        (1, 1, FOUR, "1,4", "--gpu-ids 1,4: GPU 4 is not visible (4 GPU(s) visible: 0, 1, 2, 3)"),
    ],
)  # fmt: skip
def test_too_few_gpus_is_one_line(num, per, visible, ids, message):
    with pytest.raises(ConfigError) as e:
        place_replicas(num, per, visible, ids)
    assert str(e.value) == message and "\n" not in str(e.value)


def test_gpu_ids_pick_a_subset_in_the_order_given():
    assert place_replicas(2, 1, FOUR, "2,3") == [["2"], ["3"]]
    assert place_replicas(2, 1, FOUR, "3,0") == [["3"], ["0"]]
    assert place_replicas(1, 1, FOUR, "1,2,3") == [["1"]]  # more than needed: the first
    assert place_replicas(1, 2, FOUR, "3,1") == [["3", "1"]]
    # indexes into the visible GPUs, as CUDA_VISIBLE_DEVICES numbers them for this process
    assert place_replicas(2, 1, ["4", "6", "7"], "1,2") == [["6"], ["7"]]
    assert place_replicas(2, 1, None, "5,7") == [["5"], ["7"]]  # uncounted: taken as given


@pytest.mark.parametrize("text", ["", "a", "2,,3", "1,1", "-1", "1;2", "0x1"])
def test_bad_gpu_ids_are_refused_when_the_config_is_built(text):
    with pytest.raises(ConfigError, match="gpu_ids"):
        Config(gpu_ids=text)


def test_gpu_ids_from_a_config_file(tmp_path):
    path = tmp_path / "zs.json"
    path.write_text('{"gpu_ids": "2,3", "data_parallel_size": 2}')
    assert Config.load(path).gpu_ids == "2,3"
    path.write_text('{"gpu_ids": [2, 3]}')
    with pytest.raises(ConfigError, match="config key gpu_ids must be str"):
        Config.load(path)


def test_visible_gpus_from_the_standin_count_then_cuda_visible_devices(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    assert visible_gpus() == ["2", "3"]
    monkeypatch.setenv("ZEROSERVE_STANDIN_GPU_COUNT", "4")  # a stand-in wins
    assert visible_gpus() == FOUR
    monkeypatch.setenv("ZEROSERVE_STANDIN_GPU_COUNT", "many")
    with pytest.raises(ConfigError, match="ZEROSERVE_STANDIN_GPU_COUNT must be an integer"):
        visible_gpus()
    monkeypatch.delenv("ZEROSERVE_STANDIN_GPU_COUNT")
    for text, seen in [
        ("GPU-8f2e,GPU-11aa", ["GPU-8f2e", "GPU-11aa"]),  # UUIDs, kept as named
        ("0,-1,2", ["0"]),  # CUDA stops at the first entry that is no device
        ("", []),  # none
        (" 1 , 0 ", ["1", "0"]),
    ]:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", text)
        assert visible_gpus() == seen, text


def fake_nvidia_smi(folder, text: str, code: int = 0) -> None:
    path = folder / "nvidia-smi"
    path.write_text(f"#!/bin/sh\ncat <<'EOF'\n{text}EOF\nexit {code}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def test_nvidia_smi_counts_gpus_not_mig_slices(monkeypatch, tmp_path):
    fake_nvidia_smi(
        tmp_path,
        "GPU 0: NVIDIA H200 (UUID: GPU-aaaa)\n"
        "  MIG 1g.18gb     Device  0: (UUID: MIG-bbbb)\n"
        "GPU 1: NVIDIA H200 (UUID: GPU-cccc)\n",
    )
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    assert visible_gpus() == ["0", "1"]
    fake_nvidia_smi(tmp_path, "NVIDIA-SMI has failed\n", code=9)  # no driver: not a count
    monkeypatch.setattr(gpus, "NVIDIA_GPUS", tmp_path / "absent")
    assert visible_gpus() is None


def test_plan_gpus_only_when_the_replicas_run_on_gpus(monkeypatch):
    monkeypatch.setenv("ZEROSERVE_STANDIN_GPU_COUNT", "4")
    cfg = Config(data_parallel_size=2)
    cuda = replace(cfg, engine=replace(cfg.engine, model=replace(cfg.engine.model, device="cuda")))
    cpu = replace(cfg, engine=replace(cfg.engine, model=replace(cfg.engine.model, device="cpu")))
    assert plan_gpus(cuda, GPU_BUILD) == [["0"], ["1"]]
    assert plan_gpus(replace(cuda, gpu_ids="2,3"), GPU_BUILD) == [["2"], ["3"]]
    assert plan_gpus(cfg, GPU_BUILD) == [["0"], ["1"]]  # auto on a GPU build: the GPUs
    assert plan_gpus(cfg, CPU_BUILD) is None  # auto on a CPU build: the CPU
    assert plan_gpus(cpu, GPU_BUILD) is None
    with pytest.raises(ConfigError, match=r"^--gpu-ids 2,3: the replicas run on the CPU here"):
        plan_gpus(replace(cpu, gpu_ids="2,3"), GPU_BUILD)
    with pytest.raises(ConfigError, match="needs 3 GPU"):
        plan_gpus(replace(cuda, data_parallel_size=3, gpu_ids="1,2"), GPU_BUILD)
    monkeypatch.setenv("ZEROSERVE_STANDIN_GPU_COUNT", "0")
    assert plan_gpus(cfg, GPU_BUILD) is None  # auto, no GPU: the CPU
    with pytest.raises(ConfigError, match="needs 2 GPU"):
        plan_gpus(cuda, GPU_BUILD)


def test_a_replica_names_the_gpu_its_launcher_gave_it(monkeypatch):
    assert own_gpus(0) == ["0"]  # nothing set: the device's own index
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")  # launch.py's replica on GPU 3
    assert own_gpus(0) == ["3"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-8f2e,GPU-11aa")
    assert own_gpus(1) == ["GPU-11aa"]
