"""deploy/supervisor/zeroserve.conf under a real supervisord: the deployment serves, a
SIGKILLed tokenizer and detokenizer are restarted by supervisord and the service serves
again, `supervisorctl stop all` leaves no process behind, and every component stops on
SIGTERM with exit status 0.

The deploy file is used as shipped except for what a test cannot have: the `user=` lines
(no zeroserve user here), the log directory (a temp dir) and numprocs (2 tokenizers). Its
%(ENV_ZEROSERVE_PYTHON)s / %(ENV_ZEROSERVE_CONFIG)s placeholders are filled by supervisord
from its environment, as in a deployment. The shared config is deploy/zeroserve.json with a
short temp run dir (ipc paths are limited to 107 bytes), a free port, float32 and a small
KV pool.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from common.config import Config
from common.env import default_cache_dir
from tests.e2e.conftest import free_port

pytest.importorskip("supervisor", reason="supervisor is in the test extra: pip install -e .[test]")

pytestmark = pytest.mark.timeout(240)

REPO = Path(__file__).resolve().parents[2]
DEPLOY_CONF = REPO / "deploy" / "supervisor" / "zeroserve.conf"
DEPLOY_JSON = REPO / "deploy" / "zeroserve.json"
BIN = Path(sys.executable).parent
GROUP = "zeroserve"
TOKENIZERS = 2
PROGRAMS = ["zeroserve-scheduler", "zeroserve-detok", "zeroserve-frontend"] + [
    f"zeroserve-tokenizer-{i}" for i in range(TOKENIZERS)
]
HEALTH_TIMEOUT_S = 120.0
RESTART_TIMEOUT_S = 60.0
CMD_TIMEOUT_S = 60.0


def wait_for(cond, timeout_s: float, what: str, interval_s: float = 0.2):
    deadline = time.monotonic() + timeout_s
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(interval_s)


@dataclass
class Deployment:
    base: Path  # everything of this deployment lives here
    port: int
    supervisord_conf: Path
    config_path: Path  # the shared zeroserve config, on every component's command line
    env: dict[str, str]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def ctl(self, *args: str, check: bool = True) -> str:
        r = subprocess.run(
            [str(BIN / "supervisorctl"), "-c", str(self.supervisord_conf), *args],
            capture_output=True,
            text=True,
            timeout=CMD_TIMEOUT_S,
            env=self.env,
        )
        # supervisorctl exits non-zero for "not running" states in `status`; callers decide
        if check and r.returncode not in (0, 3):
            raise AssertionError(
                f"supervisorctl {' '.join(args)} -> {r.returncode}: "
                f"{r.stdout}{r.stderr}\n{self.logs()}"
            )
        return r.stdout

    def pid(self, program: str) -> int:
        out = self.ctl("pid", f"{GROUP}:{program}").strip()
        return int(out) if out.isdigit() else 0

    def state(self, program: str) -> str:
        out = self.ctl("status", f"{GROUP}:{program}", check=False).split()
        return out[1] if len(out) > 1 else "?"

    def health(self) -> dict | None:
        try:
            r = httpx.get(self.url + "/health", timeout=2)
        except httpx.HTTPError:
            return None
        return r.json() if r.status_code == 200 else None

    def processes(self, pattern: str | Path) -> list[int]:
        out = subprocess.run(["pgrep", "-f", "--", str(pattern)], capture_output=True, text=True)
        return [int(p) for p in out.stdout.split() if int(p) != os.getpid()]

    def problems(self) -> str:
        """Warning, error and traceback lines of the component logs (printed at the end)."""
        out = []
        for p in sorted((self.base / "log").glob("*.log")):
            for line in p.read_text(errors="replace").splitlines():
                if re.match(r"^\S+ [WE] ", line) or "Traceback" in line or "Error" in line:
                    out.append(f"{p.stem}: {line}")
        return "\n".join(out)

    def logs(self, tail: int = 3000) -> str:
        parts = []
        for p in sorted((self.base / "log").glob("*.log")) + [self.base / "supervisord.log"]:
            if p.exists():
                parts.append(f"--- {p.name}\n{p.read_text(errors='replace')[-tail:]}")
        return "\n".join(parts)


def write_deployment(base: Path) -> Deployment:
    run_dir = base / "run"
    run_dir.mkdir(mode=0o700)  # as deploy/tmpfiles.d/zeroserve.conf makes /run/zeroserve
    (base / "log").mkdir()
    port = free_port()
    cfg = json.loads(DEPLOY_JSON.read_text())
    cfg["engine"]["model"].update(dtype="float32", cache_dir=str(default_cache_dir()))
    cfg["engine"]["cache"]["num_blocks"] = 512
    cfg["server"]["port"] = port
    cfg["ipc"]["run_dir"] = str(run_dir)
    config_path = base / "zeroserve.json"
    Config.from_dict(cfg).save(config_path)  # validated, mode 0600

    text = DEPLOY_CONF.read_text()
    assert "%(ENV_ZEROSERVE_PYTHON)s" in text and "%(ENV_ZEROSERVE_CONFIG)s" in text
    text, n = re.subn(r"(?m)^user=zeroserve\n", "", text)
    assert n == 4, "every program runs as user=zeroserve"
    text, n = re.subn(r"(?m)^numprocs=\d+$", f"numprocs={TOKENIZERS}", text)
    assert n == 1
    text = text.replace("/var/log/zeroserve/", f"{base}/log/")
    assert "/var/log" not in text
    (base / "zeroserve.conf").write_text(text)

    supervisord_conf = base / "supervisord.conf"
    supervisord_conf.write_text(f"""\
[unix_http_server]
file={base}/supervisor.sock
chmod=0700

[supervisord]
nodaemon=false
logfile={base}/supervisord.log
pidfile={base}/supervisord.pid
childlogdir={base}/log
directory={base}

[rpcinterface:supervisor]
supervisor.rpcinterface_factory = supervisor.rpcinterface:make_main_rpcinterface

[supervisorctl]
serverurl=unix://{base}/supervisor.sock

[include]
files = {base}/zeroserve.conf
""")
    env = {**os.environ, "ZEROSERVE_PYTHON": sys.executable, "ZEROSERVE_CONFIG": str(config_path)}
    return Deployment(base, port, supervisord_conf, config_path, env)


def alive(pid: int) -> bool:
    """Running, and not a zombie (a daemonized supervisord is reaped by PID 1, if ever)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def stream_completion(url: str, prompt: str) -> str:
    body = {"prompt": prompt, "max_tokens": 8, "stream": True, "ignore_eos": True}
    text, done = [], False
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=60) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line == "data: [DONE]":
                done = True
            elif line.startswith("data: "):
                chunk = json.loads(line[len("data: ") :])
                assert "error" not in chunk, chunk
                text.append(chunk["choices"][0]["text"])
    assert done, "stream ended without data: [DONE]"
    assert "".join(text), "no text streamed"
    return "".join(text)


def completion(url: str, prompt: str) -> str:
    r = httpx.post(
        url + "/v1/completions",
        timeout=60,
        json={"prompt": prompt, "max_tokens": 8, "ignore_eos": True},
    )
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 8
    return r.json()["choices"][0]["text"]


@pytest.fixture
def deployment(default_model_dir):  # the model converted once, before anything starts
    base = Path(tempfile.mkdtemp(prefix="zs-sv-", dir="/tmp"))  # short: ipc paths
    try:
        dep = write_deployment(base)
    except BaseException:
        shutil.rmtree(base, ignore_errors=True)
        raise
    try:
        r = subprocess.run(
            [str(BIN / "supervisord"), "-c", str(dep.supervisord_conf)],
            capture_output=True,
            text=True,
            timeout=CMD_TIMEOUT_S,
            env=dep.env,
        )
        assert r.returncode == 0, f"supervisord: {r.stdout}{r.stderr}\n{dep.logs()}"
        yield dep
    finally:
        print(f"component log warnings/errors:\n{dep.problems()}")
        with contextlib.suppress(Exception):
            dep.ctl("shutdown", check=False)
        # supervisord stops its programs on shutdown; give it the frontend's drain time
        with contextlib.suppress(AssertionError):
            wait_for(lambda: not dep.processes(base), 45, "supervisord to shut down")
        for pid in dep.processes(base):  # stragglers, even when the test failed
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(base, ignore_errors=True)


def test_supervisor_deployment(deployment: Deployment):
    dep = deployment
    t0 = time.monotonic()
    try:
        health = wait_for(dep.health, HEALTH_TIMEOUT_S, "/health 200")
    except AssertionError as e:
        raise AssertionError(f"{e}\n{dep.ctl('status', check=False)}\n{dep.logs()}") from None
    assert health["components"]["tokenizer"]["workers"] >= 1
    print(f"healthy after {time.monotonic() - t0:.1f} s")
    # RUNNING once up for startsecs (the engine may be serving before)
    wait_for(lambda: all(dep.state(p) == "RUNNING" for p in PROGRAMS), 30, "all RUNNING")
    print(f"all RUNNING after {time.monotonic() - t0:.1f} s")
    stream_completion(dep.url, "The sky is")
    print(f"first stream done after {time.monotonic() - t0:.1f} s")

    # SIGKILL one tokenizer and the detokenizer: supervisord restarts both
    victims = ["zeroserve-tokenizer-0", "zeroserve-detok"]
    old = {p: dep.pid(p) for p in victims}
    assert all(old.values()), old
    for pid in old.values():
        os.kill(pid, signal.SIGKILL)
    t1 = time.monotonic()
    wait_for(
        lambda: all(dep.pid(p) not in (0, old[p]) and dep.state(p) == "RUNNING" for p in victims),
        RESTART_TIMEOUT_S,
        "restarts",
    )
    # both restarted processes heard from, the dead tokenizer's pid aged out of the window
    try:
        wait_for(
            lambda: (h := dep.health()) and h["components"]["tokenizer"]["workers"] == TOKENIZERS,
            RESTART_TIMEOUT_S,
            f"/health 200 with {TOKENIZERS} tokenizer workers",
        )
    except AssertionError as e:
        raise AssertionError(f"{e}\n{dep.ctl('status', check=False)}\n{dep.logs()}") from None
    print(f"restarted and healthy after {time.monotonic() - t1:.1f} s")
    # several requests in a row: the frontend's PUSH deals them round-robin to the
    # connected tokenizers, the restarted one included
    for i in range(3):
        stream_completion(dep.url, f"Request {i}: once upon a time")
        completion(dep.url, f"Request {i}: the capital of France is")
    print(f"6 requests done after {time.monotonic() - t1:.1f} s")

    # stop everything: no process of the deployment is left, each stopped cleanly
    t2 = time.monotonic()
    dep.ctl("stop", "all")
    print(f"stopped in {time.monotonic() - t2:.1f} s")
    status = dep.ctl("status", check=False)
    for program in PROGRAMS:
        assert re.search(rf"^{GROUP}:{program}\s+STOPPED", status, re.M), status
    assert dep.processes(dep.config_path) == [], dep.logs()
    sv_log = (dep.base / "supervisord.log").read_text()
    stopped = re.findall(r"stopped: (\S+) \((.*?)\)", sv_log)
    assert sorted(name for name, _ in stopped) == sorted(PROGRAMS), sv_log
    assert all(how == "exit status 0" for _, how in stopped), sv_log

    # supervisord itself goes away on shutdown
    supervisord_pid = int((dep.base / "supervisord.pid").read_text())
    dep.ctl("shutdown")
    wait_for(lambda: not alive(supervisord_pid), 30, "supervisord to exit")
    print(f"supervisord gone after {time.monotonic() - t2:.1f} s")
    assert dep.processes(dep.base) == []


def test_example_config_loads():
    cfg = Config.load(DEPLOY_JSON)
    assert cfg.ipc.run_dir == "/run/zeroserve"
    assert (cfg.server.host, cfg.server.port) == ("127.0.0.1", 8000)
    assert cfg.engine.model.model == "smollm2"
    assert cfg.engine.model.cache_dir == "/var/cache/zeroserve"


def test_stop_timeouts_leave_room_for_the_drain():
    import configparser

    parser = configparser.RawConfigParser(inline_comment_prefixes=(";",))
    parser.read(DEPLOY_CONF)
    drain = Config.load(DEPLOY_JSON).server.drain_timeout_s
    programs = [s for s in parser.sections() if s.startswith("program:")]
    assert len(programs) == 4
    for section in programs:  # every component drains on SIGTERM before it exits
        assert parser.getint(section, "stopwaitsecs") >= drain + 10, section
        assert parser.get(section, "stopsignal") == "TERM"
