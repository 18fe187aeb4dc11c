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
