"""Where the components meet: endpoint addresses and the private run dir of ipc sockets.

    ipc://<run_dir>/<name>.sock   the default; run_dir from the config, else
                                  ZEROSERVE_RUN_DIR, else $XDG_RUNTIME_DIR/zeroserve-<uid>
                                  (the temp dir when XDG_RUNTIME_DIR is unset)
    tcp://host:port               as given, when components live on different hosts

No zmq here, so a config names its endpoints without it (common.config), and naming one
has no side effect: the run dir is created once, where a process starts
(`ensure_run_dir`: common.cli.parse_config for every `python -m <component>`, launch.py
for its own). The dir must be ours, mode 0700 and not a symlink; that is checked when an
endpoint in it is named and again when a socket binds there (common.zmq_queue), so no
other local user can plant a socket that a component would connect to.
"""

from __future__ import annotations

import os
import re
import stat
import tempfile
from pathlib import Path

from common.env import env, runtime_dir

MAX_IPC_PATH = 107  # sizeof(sockaddr_un.sun_path) - 1 on Linux
_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


def default_run_dir() -> Path:
    explicit = env("RUN_DIR")
    if explicit:
        return Path(explicit).expanduser()
    return Path(runtime_dir() or tempfile.gettempdir()) / f"zeroserve-{os.getuid()}"


def check_private_dir(path: str | Path) -> Path:
    """Refuse a directory that is missing, a symlink, not ours, or group/world accessible."""
    path = Path(path)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise FileNotFoundError(
            f"run dir {path} does not exist (a component creates it when "
            "it starts: common.endpoints.ensure_run_dir)"
        ) from None
    if not stat.S_ISDIR(st.st_mode):
        raise PermissionError(f"run dir {path} is not a directory (or is a symlink)")
    if st.st_uid != os.getuid():
        raise PermissionError(f"run dir {path} is owned by uid {st.st_uid}, not {os.getuid()}")
    if st.st_mode & 0o077:
        raise PermissionError(f"run dir {path} has mode {st.st_mode & 0o777:o}; it must be 0700")
    return path


def ensure_run_dir(path: str | Path | None = None) -> Path:
    """Create the private run dir (mode 0700) if missing; verify it either way."""
    path = Path(path) if path is not None else default_run_dir()
    if not path.exists():
        os.makedirs(path, mode=0o700, exist_ok=True)
        os.chmod(path, 0o700)  # makedirs' mode is filtered by the umask
    return check_private_dir(path)


def ipc_endpoint(run_dir: str | Path, name: str) -> str:
    """ipc://<run_dir>/<name>.sock; run_dir must exist already (see ensure_run_dir)."""
    if not _NAME.match(name):
        raise ValueError(f"bad socket name {name!r}")
    path = Path(run_dir).resolve() / f"{name}.sock"
    if len(os.fsencode(path)) > MAX_IPC_PATH:
        raise ValueError(
            f"ipc path {path} is longer than {MAX_IPC_PATH} bytes; use a shorter run dir"
        )
    check_private_dir(run_dir)
    return f"ipc://{path}"


def endpoint(name: str, run_dir: str | Path | None = None, address: str | None = None) -> str:
    """`address` (tcp://host:port) as given, else ipc://<run_dir>/<name>.sock."""
    if address:
        return check_endpoint(address)
    return ipc_endpoint(run_dir if run_dir is not None else default_run_dir(), name)


def ipc_in_use(ep: str) -> bool:
    """Whether a process listens at an ipc:// endpoint now. ZeroMQ binding an ipc path
    takes it over silently, so a second process claiming one (a second replica with the
    same id) must look first; a stale file of a dead process is not in use."""
    import socket

    if not ep.startswith("ipc://"):
        return False
    path = ep[len("ipc://") :]
    if not os.path.exists(path):
        return False
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        try:
            s.connect(path)
        except OSError:
            return False
    return True


def advertised(ep: str) -> str:
    """The address peers dial for a bound endpoint: a wildcard tcp host (* or 0.0.0.0)
    becomes this host's address."""
    import socket

    m = re.match(r"^tcp://(\*|0\.0\.0\.0):(\d+)$", ep)
    if not m:
        return ep
    try:
        host = socket.gethostbyname(socket.gethostname())
    except OSError:
        host = "127.0.0.1"
    return f"tcp://{host}:{m.group(2)}"


def check_endpoint(ep: str) -> str:
    if ep.startswith("ipc://") and len(ep) > len("ipc://"):
        return ep
    if re.match(r"^tcp://[^:/\s]+:\d{1,5}$", ep) or re.match(
        r"^tcp://\[[0-9a-fA-F:]+\]:\d{1,5}$", ep
    ):
        return ep
    raise ValueError(f"endpoint must be ipc://<path> or tcp://host:port, got {ep!r}")
