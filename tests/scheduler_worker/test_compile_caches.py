"""The scheduler process keeps compiled kernels (Triton's, torch inductor's) under the cache
dir a user sets, unless the user pointed them elsewhere; set before anything is compiled."""

from __future__ import annotations

import os

import pytest

import scheduler_worker.__main__ as scheduler_main
import scheduler_worker.worker

VARS = ("TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR")


def start(monkeypatch, tmp_path, *argv: str) -> dict[str, str | None]:
    """scheduler_worker's main as `python -m scheduler_worker` runs it, up to the engine:
    the environment its run() starts with."""
    seen: dict[str, str | None] = {}

    def run(config) -> None:
        seen.update({v: os.environ.get(v) for v in VARS})
        from torch._inductor.runtime.cache_dir_utils import cache_dir

        seen["inductor_reads"] = cache_dir()  # torch's own answer, not just our variable

    monkeypatch.setattr(scheduler_worker.worker, "run", run)
    scheduler_main.main(["--run-dir", str(tmp_path / "run"), *argv])
    return seen


@pytest.fixture
def clean_env(monkeypatch):
    for v in VARS:
        monkeypatch.delenv(v, raising=False)


def test_caches_go_under_zeroserve_cache_dir(monkeypatch, tmp_path, clean_env):
    monkeypatch.setenv("ZEROSERVE_CACHE_DIR", str(tmp_path / "zs"))
    seen = start(monkeypatch, tmp_path)
    assert seen["TRITON_CACHE_DIR"] == str(tmp_path / "zs" / "triton")
    assert seen["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "zs" / "inductor")
    assert seen["inductor_reads"] == str(tmp_path / "zs" / "inductor")


def test_config_cache_dir_wins_and_a_users_own_setting_is_kept(monkeypatch, tmp_path, clean_env):
    monkeypatch.setenv("ZEROSERVE_CACHE_DIR", str(tmp_path / "zs"))
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "mine"))
    config = tmp_path / "c.json"
    config.write_text('{"engine": {"model": {"cache_dir": "%s"}}}' % (tmp_path / "cfg"))
    seen = start(monkeypatch, tmp_path, "--config", str(config))
    assert seen["TRITON_CACHE_DIR"] == str(tmp_path / "mine")
    assert seen["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "cfg" / "inductor")
