from __future__ import annotations

import os
import shutil
import socket
import stat
import tempfile
import time
from pathlib import Path

import pytest
import zmq

from common.config import ENDPOINT_NAMES, Config, IPCConfig
from common.endpoints import check_endpoint, endpoint, ensure_run_dir, ipc_endpoint
from common.messages import AbortRequest, ComponentStatus, Message, encode
from common.zmq_queue import PullQueue, PushQueue, QueueFull


@pytest.fixture
def run_dir():
    """A run dir path that does not exist yet (ensure_run_dir creates it)."""
    d = Path(tempfile.mkdtemp(dir="/tmp", prefix="zsq-"))  # short: ipc paths max ~107 bytes
    yield d / "run"
    shutil.rmtree(d, ignore_errors=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(params=["ipc", "tcp"])
def ep(request, run_dir) -> str:
    if request.param == "ipc":
        return ipc_endpoint(ensure_run_dir(run_dir), "inbox")
    return f"tcp://127.0.0.1:{free_port()}"


def msgs(n: int) -> list[AbortRequest]:
    return [AbortRequest(f"r{i}", "test") for i in range(n)]


def drain_until(pull: PullQueue, n: int, max_messages: int | None = None) -> list[Message]:
    """drain() repeatedly (never more than max_messages a call) until n messages came;
    messages sent together may arrive in several pieces."""
    got: list[Message] = []
    deadline = time.monotonic() + 5
    while len(got) < n:
        assert time.monotonic() < deadline, f"only {len(got)} of {n} messages arrived"
        cap = None if max_messages is None else min(max_messages, n - len(got))
        batch = pull.drain(max_messages=cap)
        assert cap is None or len(batch) <= cap
        got += batch
        if not batch:
            pull.socket.poll(50, zmq.POLLIN)
    return got


def test_round_trip_get_and_timeout(ep):
    with PullQueue(ep, bind=True) as pull, PushQueue(ep, bind=False) as push:
        assert pull.get(timeout_ms=50) is None
        assert isinstance(pull.fileno(), int) and pull.socket.type == zmq.PULL
        push.put(AbortRequest("r0", "because"))
        assert pull.get(timeout_ms=2000) == AbortRequest("r0", "because")
        t0 = time.monotonic()
        assert pull.get(timeout_ms=100) is None
        assert time.monotonic() - t0 >= 0.09


def test_push_binds_pull_connects(ep):
    with PushQueue(ep, bind=True) as push, PullQueue(ep, bind=False) as pull:
        deadline = time.monotonic() + 5
        while True:  # a bound PUSH has no peer until the PULL's connection is up
            try:
                push.put(ComponentStatus("detok", os.getpid(), "ready", 1.0))
                break
            except QueueFull:
                assert time.monotonic() < deadline
                time.sleep(0.01)
        assert pull.get(timeout_ms=2000) == ComponentStatus("detok", os.getpid(), "ready", 1.0)


def test_drain_and_get_batch(ep):
    with PullQueue(ep, bind=True) as pull, PushQueue(ep, bind=False) as push:
        assert pull.drain() == []
        assert pull.get_batch(timeout_ms=20) == []
        sent = msgs(50)
        for m in sent:
            push.put(m)
        first = pull.get(timeout_ms=2000)
        assert [first, *drain_until(pull, len(sent) - 1)] == sent
        for m in sent[:10]:
            push.put(m)
        assert drain_until(pull, 4, max_messages=4) == sent[:4]
        rest = pull.get_batch(timeout_ms=2000)
        rest += drain_until(pull, 6 - len(rest))
        assert rest == sent[4:10]
        assert pull.drain() == []


def test_garbage_is_dropped_and_next_message_arrives(ep):
    with PullQueue(ep, bind=True) as pull:
        raw = zmq.Context.instance().socket(zmq.PUSH)
        raw.setsockopt(zmq.LINGER, 0)
        raw.connect(ep)
        try:
            raw.send(b"\x80\x04\x95 not msgpack, a pickle header")
            raw.send(encode(AbortRequest("r", "x"))[:-1])  # truncated
            raw.send_multipart([encode(AbortRequest("r", "x")), b"second part"])
            raw.send(encode(AbortRequest("good", "x")))
            assert pull.get(timeout_ms=2000) == AbortRequest("good", "x")
            assert pull.num_dropped == 3
            raw.send(b"\xc1")
            raw.send(encode(AbortRequest("also good", "x")))
            assert drain_until(pull, 1) == [AbortRequest("also good", "x")]
            assert pull.num_dropped == 4
        finally:
            raw.close()


def test_put_full_queue_raises_instead_of_blocking(run_dir):
    ep = ipc_endpoint(ensure_run_dir(run_dir), "nobody")
    with PushQueue(ep, bind=True, hwm=1) as push:  # bound, no peer: nowhere to queue
        t0 = time.monotonic()
        with pytest.raises(QueueFull):
            push.put(AbortRequest("r", "x"))
        with pytest.raises(QueueFull):
            push.put(AbortRequest("r", "x"), timeout_ms=50)
        assert time.monotonic() - t0 < 2
    with PushQueue(ipc_endpoint(run_dir, "later"), bind=False, hwm=3) as push:
        for m in msgs(3):  # a connecting PUSH queues up to its HWM, then refuses
            push.put(m)
        with pytest.raises(QueueFull):
            push.put(AbortRequest("r", "x"))


def test_run_dir_created_private(run_dir):
    old = os.umask(0o022)
    try:
        path = ensure_run_dir(run_dir)
    finally:
        os.umask(old)
    st = os.stat(path)
    assert stat.S_IMODE(st.st_mode) == 0o700 and st.st_uid == os.getuid()
    assert ensure_run_dir(run_dir) == path  # an existing private dir is fine
    assert endpoint("sched", run_dir) == f"ipc://{path.resolve()}/sched.sock"


def test_naming_an_endpoint_creates_nothing(run_dir):
    """The run dir is made where a process starts (ensure_run_dir), not as a side effect
    of naming an endpoint, which only checks it."""
    config = Config(ipc=IPCConfig(run_dir=str(run_dir)))
    with pytest.raises(FileNotFoundError, match="does not exist"):
        config.ipc.endpoint("scheduler")
    assert not run_dir.exists()
    assert config.ipc.resolved_run_dir == run_dir
    ensure_run_dir(config.ipc.resolved_run_dir)
    assert config.ipc.endpoint("scheduler") == f"ipc://{run_dir.resolve()}/scheduler.sock"
    tcp = {name: f"tcp://127.0.0.1:{5000 + i}" for i, name in enumerate(ENDPOINT_NAMES)}
    assert IPCConfig(**tcp).resolved_run_dir is None  # nothing to create


def test_public_run_dir_refused(run_dir):
    run_dir.mkdir(mode=0o700)
    os.chmod(run_dir, 0o755)
    with pytest.raises(PermissionError, match="0700"):
        ensure_run_dir(run_dir)
    with pytest.raises(PermissionError):
        ipc_endpoint(run_dir, "x")
    with pytest.raises(PermissionError):  # binding into it directly is refused too
        PullQueue(f"ipc://{run_dir}/x.sock", bind=True)
    link = run_dir.parent / "link"
    os.chmod(run_dir, 0o700)
    link.symlink_to(run_dir)
    with pytest.raises(PermissionError, match="symlink"):
        ensure_run_dir(link)


def test_endpoint_validation(run_dir):
    assert endpoint("x", run_dir, address="tcp://10.0.0.1:5555") == "tcp://10.0.0.1:5555"
    assert check_endpoint("tcp://[::1]:80") == "tcp://[::1]:80"
    for bad in ("", "inproc://x", "tcp://host", "udp://h:1", "ipc://"):
        with pytest.raises(ValueError):
            check_endpoint(bad)
    with pytest.raises(ValueError):
        ipc_endpoint(run_dir, "../escape")
    with pytest.raises(ValueError, match="longer"):
        ipc_endpoint(run_dir / ("d" * 120), "x")
