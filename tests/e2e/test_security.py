"""What a foreign local process can do with the sockets of a running server: nothing that
crashes a worker, and no generation for a request the frontend never accepted.

The guarantees (see common.auth and common.zmq_queue): the IPC sockets live in a 0700 run
dir, so only this user can reach them; every frame is schema-checked and bad ones are
dropped; the scheduler generates only for request ids signed with the per-launch secret
(HMAC), which lives in the 0600 config file, never on a command line; outputs for ids the
frontend does not know are dropped, and ids carry 128 random bits plus the tag, so a
forger cannot name a live request.
"""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

import httpx
import msgpack
import pytest
import zmq

from common.messages import GenerateRequest, TextOutputs, encode, pack_ids
from common.sampling_params import SamplingParams
from tests.common.wire_samples import step_outputs

pytestmark = pytest.mark.timeout(120)


def push_raw(endpoint: str, frames: list[bytes]) -> None:
    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.PUSH)
    sock.setsockopt(zmq.LINGER, 2000)
    sock.connect(endpoint)
    for f in frames:
        sock.send(f)
    time.sleep(0.3)
    sock.close()


def test_run_dir_and_config_are_private(server):
    assert stat.S_IMODE(os.stat(server.run_dir).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(server.run_dir / "config.json").st_mode) == 0o600
    cmdlines = [Path(f"/proc/{p}/cmdline").read_bytes() for p in server.pids()]
    assert cmdlines and all(b"secret" not in c for c in cmdlines)


def test_forged_and_garbage_frames_change_nothing(server):
    pids = sorted(server.pids())
    # the session's server: a request an earlier test left finishing (a client gone, its
    # abort on the way) must not count as a forged one that ran, nor its tokens
    before = server.wait_idle(timeout_s=30)
    params = SamplingParams(max_tokens=500, ignore_eos=True)
    forged = [
        GenerateRequest("cmpl-forged-0", pack_ids([1, 2, 3]), params, time.time()),
        GenerateRequest("cmpl-forged-0." + "0" * 32, pack_ids([1, 2, 3]), params, 0.0),
    ]
    garbage = [
        b"",
        b"\x00" * 64,
        msgpack.packb([1, 999, "x"]),
        msgpack.packb({"a": 1}),
        os.urandom(2048),
    ]
    sock = lambda name: f"ipc://{server.run_dir}/{name}.sock"  # noqa: E731
    push_raw(sock("scheduler"), [encode(m) for m in forged] + garbage)
    step = step_outputs(
        1,
        ["cmpl-forged-0"],
        [pack_ids([42])],
        ["length"],
        [3],
        [1],
        None,
        [("cmpl-forged-0", [], True, False, 0, 0)],
        None,
        time.time(),
    )
    push_raw(sock("detok"), [encode(step)] + garbage)
    text = TextOutputs(
        ["cmpl-forged-0"], ["boo"], ["stop"], [1], [1], [b""], None, None, [None], time.time()
    )
    push_raw(sock("frontend"), [encode(text)] + garbage)
    # the forged requests never run: nothing running, every block free, for 2 heartbeats
    deadline = time.monotonic() + 2.5
    while time.monotonic() < deadline:
        m = server.metrics()
        assert m["zeroserve:num_requests_running"] == 0
        assert m["zeroserve:kv_cache_free_blocks"] == m["zeroserve:kv_cache_total_blocks"]
        time.sleep(0.2)
    assert "did not sign" in server.log()
    after = server.metrics()
    assert after["zeroserve:generation_tokens_total"] == before["zeroserve:generation_tokens_total"]
    # every worker is alive and serves
    assert sorted(server.pids()) == pids
    r = httpx.post(
        server.url + "/v1/completions",
        timeout=30,
        json={"prompt": "still fine?", "max_tokens": 4, "ignore_eos": True},
    )
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4
