"""common/env.py: the OpenMP spin default launch.py gives its children."""

from __future__ import annotations

import os

import pytest

from common.env import OPENMP_SPINCOUNT, shorter_openmp_spins


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
