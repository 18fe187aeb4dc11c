"""launch.py's checks before any child starts: several frontends need a fixed port; every
tcp endpoint its children bind (port + I for frontend I and replica K past the first) is one
port of its own, and free on this host; `--device cuda` needs a GPU build of torch. Each
refusal is one line and exit 2, before the model is resolved or a process is spawned."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

import launch
from common import torch_build
from common.config import Config, ConfigError
from common.ipc_config import IPCConfig

ROOT = Path(__file__).resolve().parents[1]


def free_ports(n: int) -> list[int]:
    """n ports free now, n consecutive ones from a free base (loopback)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base + n >= 65535:
            continue
        try:
            for p in range(base, base + n):
                with socket.socket() as t:
                    t.bind(("127.0.0.1", p))
        except OSError:
            continue
        return list(range(base, base + n))
    raise RuntimeError("no run of free ports")


def tcp_config(ports: list[int], **kw) -> Config:
    ipc = IPCConfig(
        detok=f"tcp://127.0.0.1:{ports[0]}",
        scheduler=f"tcp://127.0.0.1:{ports[1]}",
        frontend=f"tcp://127.0.0.1:{ports[2]}",
        tokenizer=f"tcp://*:{ports[3]}",
    )
    return replace(Config(), ipc=ipc, **kw)


def test_several_frontends_need_a_fixed_port():
    with pytest.raises(ConfigError, match="needs a fixed --port"):
        launch.build_config(["--api-servers", "2", "--port", "0"])


def test_tcp_endpoints_free_and_apart_pass():
    ports = free_ports(8)
    # frontend 0, 1 at ports[2], ports[2] + 1: the tokenizer set starts past them
    cfg = tcp_config([ports[0], ports[1], ports[2], ports[4]], api_servers=2)
    launch.check_endpoints_free(cfg)
    assert [a for _, a in launch.bound_endpoints(cfg)] == [
        f"tcp://127.0.0.1:{ports[0]}",
        f"tcp://127.0.0.1:{ports[1]}",
        f"tcp://127.0.0.1:{ports[2]}",
        f"tcp://*:{ports[4]}",
        f"tcp://127.0.0.1:{ports[3]}",
        f"tcp://*:{ports[5]}",
    ]


def test_frontend_one_meets_the_tokenizer_set():
    ports = free_ports(6)
    cfg = tcp_config(ports[:4], api_servers=2)  # frontend 1: ports[2] + 1 == tokenizer's
    with pytest.raises(ConfigError) as e:
        launch.check_endpoints_free(cfg)
    msg = str(e.value)
    assert "frontend 0's tokenizer socket" in msg and "frontend 1's inbox" in msg
    assert f"both take port {ports[3]}" in msg


def test_a_replica_meets_the_http_port():
    ports = free_ports(6)
    cfg = tcp_config(ports[:4], data_parallel_size=2)  # replica 1: ports[1] + 1
    cfg = replace(cfg, server=replace(cfg.server, port=ports[1] + 1))
    with pytest.raises(ConfigError, match="scheduler replica 1's inbox .* and the HTTP port"):
        launch.check_endpoints_free(cfg)


def test_a_taken_port_is_refused_in_one_line_before_anything_starts(tmp_path):
    """launch.py as a user runs it: a frontend's tcp port is held by another program."""
    ports = free_ports(6)
    holder = socket.socket()
    holder.bind(("127.0.0.1", ports[2]))
    holder.listen()
    try:
        with pytest.raises(
            ConfigError, match=rf"cannot listen on 127.0.0.1:{ports[2]} \(frontend 0's inbox\)"
        ):
            launch.check_endpoints_free(tcp_config(ports[:4]))
        ipc = {
            "detok": f"tcp://127.0.0.1:{ports[0]}",
            "scheduler": f"tcp://127.0.0.1:{ports[1]}",
            "frontend": f"tcp://127.0.0.1:{ports[2]}",
            "tokenizer": f"tcp://127.0.0.1:{ports[3]}",
        }
        config = tmp_path / "zs.json"
        config.write_text(json.dumps({"ipc": ipc}))
        run = subprocess.run(
            [sys.executable, str(ROOT / "launch.py"), "--config", str(config), "--port", str(ports[4])],
            cwd=ROOT, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    finally:
        holder.close()
    assert run.returncode == 2, run.stderr[-2000:]
    lines = [ln for ln in run.stderr.splitlines() if "cannot listen" in ln]
    assert len(lines) == 1 and f"127.0.0.1:{ports[2]} (frontend 0's inbox)" in lines[0]
    assert "started" not in run.stderr  # no child was spawned


CPU_BUILD = """from typing import Optional

__all__ = ['__version__', 'debug', 'cuda', 'git_version', 'hip', 'rocm', 'xpu']
__version__ = '2.13.0+cpu'
debug = False
cuda: Optional[str] = None
git_version = 'cf30153c4c131c8164ee7798e5022d810682e2cb'
hip: Optional[str] = None
"""


@pytest.mark.parametrize(
    "text, version, gpu",
    [
        (CPU_BUILD, "2.13.0+cpu", False),
        (CPU_BUILD.replace("'2.13.0+cpu'", "'2.13.0+cu128'").replace("cuda: Optional[str] = None", "cuda: Optional[str] = '12.8'"), "2.13.0+cu128", True),
        (CPU_BUILD.replace("hip: Optional[str] = None", "hip: Optional[str] = '6.4.43482'"), "2.13.0+cpu", True),
        ("__version__ = '2.1.0'\ncuda = '12.1'\n", "2.1.0", True),  # before annotated fields
    ],
)  # fmt: skip
def test_torchs_build_is_read_from_its_version_file(text, version, gpu):
    build = torch_build.parse_version_file(text)
    assert (build.version, build.has_gpu_support) == (version, gpu)
    if gpu:
        torch_build.check_device_choice("cuda", build)
    else:
        with pytest.raises(
            ConfigError, match=r"--device cuda: this torch \(2.13.0\+cpu\) is a CPU build"
        ):
            torch_build.check_device_choice("cuda", build)
    for device in ("cpu", "auto"):
        torch_build.check_device_choice(device, build)


def test_the_installed_torch_is_read_as_torch_itself_says():
    import torch

    build = torch_build.installed_torch_build()
    assert build is not None and build.version == torch.__version__
    assert (build.cuda, build.hip) == (torch.version.cuda, torch.version.hip)


INSTALLED = torch_build.installed_torch_build()


@pytest.mark.skipif(
    INSTALLED is None or INSTALLED.has_gpu_support,
    reason="a GPU build of torch: the scheduler refuses a missing GPU itself",
)
def test_device_cuda_on_a_cpu_build_is_refused_in_one_line_before_anything_starts():
    """launch.py as a user runs it on a CPU machine: one line, exit 2, no model resolved
    and no child spawned."""
    (port,) = free_ports(1)
    run = subprocess.run(
        [sys.executable, str(ROOT / "launch.py"), "--device", "cuda", "--port", str(port)],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert run.returncode == 2, run.stderr[-2000:]
    assert run.stdout == ""
    assert run.stderr.splitlines() == [
        f"launch.py: --device cuda: this torch ({INSTALLED.version}) "
        "is a CPU build; install a CUDA build of torch on a GPU machine (README, 'GPU "
        "install'), or serve with --device cpu"
    ]
