"""What the GPU check's HTTP clients share (client.py, client_load.py): a JSON dump, a log
line, whether a pid lives, one completion."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import httpx


def dump(obj: dict, path: str) -> None:
    Path(path).write_text(json.dumps(obj, indent=1))


def log(msg: str) -> None:
    print(f"[client {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie still answers kill 0: read its state
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


def post(c: httpx.Client, url: str, body: dict) -> dict:
    r = c.post(url + "/v1/completions", json=body)
    if r.status_code != 200:
        raise RuntimeError(f"HTTP {r.status_code}: {r.text[:500]}")
    return r.json()
