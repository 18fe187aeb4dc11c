"""The kernel tests skip where the kernels do not build, but not under CI: there a failed
build fails them (tests.conftest.kernels_built)."""

from __future__ import annotations

import pytest

from scheduler_worker import kernels
from tests.conftest import kernels_built


def test_a_failed_build_skips_locally_and_fails_under_ci(monkeypatch):
    monkeypatch.setattr(kernels, "load", lambda: False)
    monkeypatch.delenv("CI", raising=False)
    assert kernels_built() is False  # the tests skip
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI=true"):
        kernels_built()
    monkeypatch.setattr(kernels, "load", lambda: True)
    assert kernels_built() is True
