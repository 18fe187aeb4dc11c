"""common/env.py: the OpenMP spin default launch.py gives its children; a scheduler
process's place among its replica's ranks from its launcher (torchrun, a LeaderWorkerSet)."""

from __future__ import annotations

import os

import pytest

from common.env import OPENMP_SPINCOUNT, LaunchedRank, launched_rank, shorter_openmp_spins


def test_spin_count_set_when_the_user_set_no_wait_policy(monkeypatch):
    monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    assert shorter_openmp_spins() == OPENMP_SPINCOUNT
    assert os.environ["GOMP_SPINCOUNT"] == OPENMP_SPINCOUNT


@pytest.mark.parametrize(
    "name,value", [("GOMP_SPINCOUNT", "infinite"), ("OMP_WAIT_POLICY", "active")]
)
def test_the_users_own_setting_is_kept(monkeypatch, name, value):
    monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    monkeypatch.setenv(name, value)
    assert shorter_openmp_spins() is None
    assert os.environ[name] == value
    if name == "OMP_WAIT_POLICY":
        assert "GOMP_SPINCOUNT" not in os.environ


def test_the_scheduler_started_alone_shortens_the_spins(monkeypatch, tmp_path):
    """A deployment that starts `python -m scheduler_worker` itself (supervisor, systemd,
    Kubernetes) gets the spin default before torch loads libgomp, as launch.py's children."""
    import scheduler_worker.worker
    from scheduler_worker.__main__ import main

    for name in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY"):
        monkeypatch.setenv(name, "x")  # recorded, so the test's own environment comes back
        monkeypatch.delenv(name)
    for name in ("TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR"):
        monkeypatch.setenv(name, str(tmp_path / name))
    seen: list = []
    monkeypatch.setattr(scheduler_worker.worker, "run", lambda cfg: seen.append(dict(os.environ)))
    main([])
    assert seen and seen[0]["GOMP_SPINCOUNT"] == OPENMP_SPINCOUNT


LAUNCH_VARS = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT") + (
    "LWS_GROUP_SIZE",
    "LWS_WORKER_INDEX",
    "LWS_LEADER_ADDRESS",
)


@pytest.fixture
def launch_env(monkeypatch):
    for name in LAUNCH_VARS:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_no_launcher_no_rank(launch_env):
    assert launched_rank() is None


def test_torchruns_rank_uses_its_agents_store(launch_env):
    for name, value in {"WORLD_SIZE": "2", "RANK": "1", "MASTER_ADDR": "10.0.0.5"}.items():
        launch_env.setenv(name, value)
    assert launched_rank() == LaunchedRank(1, 2, "10.0.0.5", 29500, 1, True, "torchrun")


def test_a_leaderworkerset_pod_is_one_rank_its_leader_hosting_the_store(launch_env):
    launch_env.setenv("LWS_GROUP_SIZE", "4")
    launch_env.setenv("LWS_WORKER_INDEX", "3")
    launch_env.setenv("LWS_LEADER_ADDRESS", "zs-0.zs.default.svc.cluster.local")
    launch_env.setenv("MASTER_PORT", "29600")
    got = launched_rank()
    assert got == LaunchedRank(
        3, 4, "zs-0.zs.default.svc.cluster.local", 29600, 0, False, "LeaderWorkerSet"
    )
    launch_env.setenv("WORLD_SIZE", "2")  # torchrun's, where both are set (torchrun in a pod)
    assert launched_rank().launcher == "torchrun"  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "env,message",
    [
        ({"LWS_GROUP_SIZE": "2"}, "LWS_LEADER_ADDRESS is not"),
        ({"LWS_GROUP_SIZE": "two", "LWS_LEADER_ADDRESS": "h"}, "LWS_GROUP_SIZE must be"),
        ({"LWS_GROUP_SIZE": "2", "LWS_LEADER_ADDRESS": "h", "MASTER_PORT": "-1"}, "MASTER_PORT"),
        ({"LWS_GROUP_SIZE": "0", "LWS_LEADER_ADDRESS": "h"}, r"at least 1 \(LeaderWorkerSet\)"),
        ({"WORLD_SIZE": "2", "RANK": "x"}, "RANK must be"),
    ],
)
def test_a_launchers_bad_variable_is_named(launch_env, env, message):
    for name, value in env.items():
        launch_env.setenv(name, value)
    with pytest.raises(ValueError, match=message):
        launched_rank()
