"""The shared config file: what loads, and what is refused with an error naming the key."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from common.cli import parse_config
from common.config import Config, ConfigError, ServerConfig

REPO = Path(__file__).resolve().parents[2]


def test_save_and_load_round_trip(tmp_path):
    config = Config(
        server=ServerConfig(port=9001, listen_when_ready=True, max_tokens_limit=64),
        tokenize_workers=3,
        heartbeat_s=0.5,
    )
    path = tmp_path / "zeroserve.json"
    config.save(path)
    assert path.stat().st_mode & 0o777 == 0o600  # it may hold ipc.secret
    assert Config.load(path) == config


def test_toml_loads(tmp_path):
    path = tmp_path / "zeroserve.toml"
    path.write_text(
        "tokenize_workers = 2\n[server]\nport = 9002\nlisten_when_ready = true\n"
        "[engine.cache]\nblock_size = 32\n"
    )
    config = Config.load(path)
    assert (config.tokenize_workers, config.server.port) == (2, 9002)
    assert config.server.listen_when_ready and config.engine.cache.block_size == 32


@pytest.mark.parametrize(
    "data, words",
    [
        ({"server": {"port": "8000"}}, ["server.port", "int", "'8000'"]),
        ({"server": {"listen_when_ready": "yes"}}, ["server.listen_when_ready", "bool"]),
        ({"server": {"port": True}}, ["server.port"]),  # a bool is not a port
        ({"server": {"api_key": 1234}}, ["server.api_key", "str | None"]),
        ({"engine": {"cache": {"block_size": 16.0}}}, ["engine.cache.block_size", "int"]),
        ({"engine": {"model": {"dtype": None}}}, ["engine.model.dtype", "str"]),
        ({"tokenize_workers": "4"}, ["tokenize_workers", "int"]),
        ({"server": {"prot": 8000}}, ["unknown config key server.prot", "port"]),
        ({"engine": {"cache": {"blocksize": 8}}}, ["engine.cache.blocksize"]),
        ({"engine": {"sampler": {}}}, ["unknown engine config keys", "sampler"]),
        ({"workers": 4}, ["unknown config key workers", "tokenize_workers"]),
        ({"server": [8000]}, ["section server must be a table"]),
        ({"engine": "cpu"}, ["section engine must be a table"]),
    ],
)
def test_wrong_keys_and_types_are_refused_by_name(tmp_path, data, words):
    path = tmp_path / "zeroserve.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigError) as info:
        Config.load(path)
    assert all(w in str(info.value) for w in words), str(info.value)


def test_numbers_where_floats_go_and_nulls_where_allowed(tmp_path):
    path = tmp_path / "zeroserve.json"
    path.write_text(
        json.dumps({"heartbeat_s": 2, "server": {"drain_timeout_s": 0, "max_tokens_limit": None}})
    )
    config = Config.load(path)
    assert config.heartbeat_s == 2 and config.server.drain_timeout_s == 0
    assert config.server.max_tokens_limit is None


@pytest.mark.parametrize("text", ["[1, 2]", "42", "{not json"])
def test_a_file_that_is_not_a_table_is_refused(tmp_path, text):
    path = tmp_path / "zeroserve.json"
    path.write_text(text)
    with pytest.raises(ConfigError, match="config"):
        Config.load(path)


@pytest.mark.parametrize("module", ["tokenizer_worker", "detok_worker"])
def test_a_component_refuses_a_bad_config_with_one_line_and_exit_2(tmp_path, module):
    path = tmp_path / "zeroserve.json"
    path.write_text(json.dumps({"server": {"port": "8000"}}))
    r = subprocess.run(
        [sys.executable, "-m", module, "--config", str(path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2, r.stderr
    assert r.stderr == f"python -m {module}: config key server.port must be int, got '8000'\n"


def test_a_component_start_makes_its_private_run_dir(tmp_path):
    """parse_config (every `python -m <component>` starts with it) creates the ipc run
    dir, mode 0700, before any socket is named (naming one creates nothing)."""
    run_dir = tmp_path / "run" / "nested"
    config = parse_config("test", ["--run-dir", str(run_dir)])
    assert config.ipc.run_dir == str(run_dir)
    assert stat.S_IMODE(os.stat(run_dir).st_mode) == 0o700
    assert config.ipc.endpoint("frontend") == f"ipc://{run_dir.resolve()}/frontend.sock"
