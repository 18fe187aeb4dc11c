"""deploy/systemd: `systemd-analyze verify` accepts every unit (no unknown keys, executable
ExecStart=), and each service carries the restart policy, the shared 0700 run dir, the
drain timeout and the sandbox keys. verify needs no running systemd (it works in a
container whose PID 1 is something else); where it is missing or cannot run at all, that
part is skipped and the static checks still run."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
UNITS = REPO / "deploy" / "systemd"
CONFIG = REPO / "deploy" / "zeroserve.json"
SERVICES = {  # unit file -> module it runs
    "zeroserve-frontend.service": "frontend",
    "zeroserve-scheduler.service": "scheduler_worker",
    "zeroserve-detok.service": "detok_worker",
    "zeroserve-tokenizer@.service": "tokenizer_worker",
}
TARGET = "zeroserve.target"
INSTALLED_PYTHON = "/opt/zeroserve/.venv/bin/python"
INSTALLED_CONFIG = "/etc/zeroserve/zeroserve.json"
ANALYZE = shutil.which("systemd-analyze") or (
    "/usr/bin/systemd-analyze" if Path("/usr/bin/systemd-analyze").exists() else None
)
HARDENING = {
    "NoNewPrivileges": "yes",
    "ProtectSystem": "strict",
    "ProtectHome": "yes",
    "PrivateTmp": "yes",
    "PrivateDevices": "yes",
    "ProtectKernelTunables": "yes",
    "ProtectKernelModules": "yes",
    "ProtectControlGroups": "yes",
    "RestrictAddressFamilies": "AF_UNIX AF_INET AF_INET6",
    "LockPersonality": "yes",
    "RestrictRealtime": "yes",
    "SystemCallArchitectures": "native",
    "CapabilityBoundingSet": "",
    "UMask": "0077",
}


def parse_unit(path: Path) -> dict[str, dict[str, list[str]]]:
    """section -> key -> every value assigned (in order); comments and blanks dropped."""
    sections: dict[str, dict[str, list[str]]] = {}
    current = None
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], {})
            continue
        assert current is not None, f"{path.name}: {raw!r} outside a section"
        assert "=" in line, f"{path.name}: not a key=value line: {raw!r}"
        key, _, value = line.partition("=")
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


def one(unit: dict, section: str, key: str) -> str:
    values = unit.get(section, {}).get(key)
    assert values, f"[{section}] {key}= missing"
    return values[-1]


def test_unit_files_present():
    names = {p.name for p in UNITS.iterdir()}
    assert names == set(SERVICES) | {TARGET}


@pytest.mark.parametrize("name", sorted(SERVICES))
def test_service_static(name: str):
    unit = parse_unit(UNITS / name)
    svc = unit["Service"]
    exec_start = one(unit, "Service", "ExecStart").split()
    assert exec_start == [INSTALLED_PYTHON, "-m", SERVICES[name], "--config", INSTALLED_CONFIG]
    assert one(unit, "Service", "Restart") in ("always", "on-failure")
    assert float(one(unit, "Service", "RestartSec")) > 0
    assert one(unit, "Service", "User") == "zeroserve"
    assert one(unit, "Service", "KillSignal") == "SIGTERM"
    assert one(unit, "Service", "RuntimeDirectory") == "zeroserve"
    assert one(unit, "Service", "RuntimeDirectoryMode") == "0700"
    assert one(unit, "Service", "RuntimeDirectoryPreserve") == "yes"
    assert one(unit, "Service", "CacheDirectory") == "zeroserve"
    assert "ZEROSERVE_CACHE_DIR=/var/cache/zeroserve" in " ".join(svc["Environment"])
    for key, value in HARDENING.items():
        assert one(unit, "Service", key) == value, f"{name}: {key}"
    assert one(unit, "Unit", "PartOf") == TARGET
    assert one(unit, "Install", "WantedBy") == TARGET
    # every component drains on SIGTERM: room for the drain, then some
    drain = json.loads(CONFIG.read_text())["server"]["drain_timeout_s"]
    assert float(one(unit, "Service", "TimeoutStopSec")) >= drain + 10


def test_stop_order_drains_frontend_first():
    """Units ordered before the frontend are stopped after it (reverse of start order)."""
    frontend = parse_unit(UNITS / "zeroserve-frontend.service")
    after = " ".join(frontend["Unit"]["After"]).split()
    assert {"zeroserve-scheduler.service", "zeroserve-detok.service"} <= set(after)
    tokenizer = parse_unit(UNITS / "zeroserve-tokenizer@.service")
    assert "zeroserve-frontend.service" in one(tokenizer, "Unit", "Before").split()


def test_target_and_shared_config():
    target = parse_unit(UNITS / TARGET)
    wants = set(one(target, "Unit", "Wants").split())
    assert wants == {
        "zeroserve-frontend.service",
        "zeroserve-scheduler.service",
        "zeroserve-detok.service",
    }
    assert one(target, "Install", "WantedBy") == "multi-user.target"
    # the units' run dir is the config's: the IPC sockets live in /run/zeroserve (0700)
    cfg = json.loads(CONFIG.read_text())
    assert cfg["ipc"]["run_dir"] == "/run/zeroserve"
    assert cfg["engine"]["model"]["cache_dir"] == "/var/cache/zeroserve"


def _verify(files: list[Path], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [ANALYZE, "verify", "--man=no", *map(str, files)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture
def verifiable(tmp_path: Path) -> Path:
    """systemd-analyze that can run here, else skip: it is tried first on a trivial unit."""
    if ANALYZE is None:
        pytest.skip("systemd-analyze is not installed")
    probe_dir = tmp_path / "probe"
    probe_dir.mkdir()
    probe = probe_dir / "zs-probe.service"
    probe.write_text(f"[Service]\nType=oneshot\nExecStart={sys.executable} -V\n")
    try:
        r = _verify([probe], probe_dir)
    except (OSError, subprocess.TimeoutExpired) as e:
        pytest.skip(f"systemd-analyze cannot run here: {e}")
    if r.returncode != 0 or r.stderr.strip():
        pytest.skip(
            f"systemd-analyze verify fails even on a trivial unit here "
            f"(rc {r.returncode}): {(r.stdout + r.stderr).strip()[:500]}"
        )
    return tmp_path


def test_systemd_analyze_verify(verifiable: Path):
    """The units as shipped, with ExecStart= pointing at this venv's python (verify checks
    that the command exists and is executable) - nothing else changed."""
    out_dir = verifiable / "units"
    out_dir.mkdir()
    for p in UNITS.iterdir():
        text = p.read_text()
        if p.suffix == ".service":
            assert INSTALLED_PYTHON in text
            text = text.replace(INSTALLED_PYTHON, sys.executable)
        (out_dir / p.name).write_text(text)
    files = sorted(out_dir.iterdir())
    r = _verify(files, out_dir)
    output = (r.stdout + r.stderr).strip()
    assert r.returncode == 0, output
    assert "Unknown" not in output and "unknown" not in output, output
    assert "ignoring" not in output, output  # bad values are "..., ignoring." too
    assert output == "", output


def test_verify_catches_a_bad_key(verifiable: Path):
    """The check above would see a mistake: an unknown key is reported."""
    out_dir = verifiable / "bad"
    out_dir.mkdir()
    text = (UNITS / "zeroserve-detok.service").read_text().replace(INSTALLED_PYTHON, sys.executable)
    bad = out_dir / "zeroserve-detok.service"
    bad.write_text(text.replace("PrivateTmp=yes", "PrivateTmp=yes\nPrivateTemp=yes"))
    r = _verify([bad], out_dir)
    assert "Unknown key" in r.stdout + r.stderr
