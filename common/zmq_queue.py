"""One typed ZeroMQ wrapper: PUSH/PULL queues carrying wire messages, and a ROUTER/DEALER
pair for a pool whose members the sender addresses one by one (the tokenizer workers).

Receive pattern: block once (`get` / `get_batch`), then `drain` with a zero timeout. A
malformed frame is logged and dropped; receiving never raises on bad input, so a peer
cannot kill a worker. Endpoint addresses and the private run dir of ipc sockets:
common/endpoints.py (binding an ipc socket checks that dir again).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import zmq
from zmq.utils.monitor import parse_monitor_message

from common.endpoints import check_endpoint, check_private_dir
from common.log import get_logger
from common.messages import MAX_FRAME_BYTES, Message, WireError, decode, encode

log = get_logger("zmq")

DEFAULT_HWM = 10_000  # messages queued per socket before put() reports QueueFull
DEFAULT_LINGER_MS = 500  # pending sends flushed at close for at most this long


class QueueFull(RuntimeError):
    """put() could not queue the message (HWM reached, or no peer on a bound PUSH)."""


class _Queue:
    def __init__(
        self,
        kind: int,
        endpoint: str,
        bind: bool,
        ctx: zmq.Context | None,
        hwm: int,
        linger_ms: int,
        options: dict[int, int | bytes] | None = None,
    ) -> None:
        self.endpoint = check_endpoint(endpoint)
        self.socket = (ctx or zmq.Context.instance()).socket(kind)
        self.socket.setsockopt(zmq.LINGER, linger_ms)
        self.socket.setsockopt(zmq.SNDHWM if kind in (zmq.PUSH, zmq.ROUTER) else zmq.RCVHWM, hwm)
        if kind in (zmq.PULL, zmq.DEALER):
            self.socket.setsockopt(zmq.MAXMSGSIZE, MAX_FRAME_BYTES)  # peers sending more are cut
        for option, value in (options or {}).items():
            self.socket.setsockopt(option, value)
        try:
            if bind:
                if self.endpoint.startswith("ipc://"):
                    check_private_dir(Path(self.endpoint[len("ipc://") :]).parent)
                self.socket.bind(self.endpoint)
            else:
                self.socket.connect(self.endpoint)
        except BaseException:
            self.socket.close(linger=0)
            raise

    def fileno(self) -> int:
        """zmq's edge-triggered notification fd (see ZMQ_FD) for external pollers."""
        return self.socket.getsockopt(zmq.FD)

    def close(self) -> None:
        if not self.socket.closed:
            self.socket.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class PushQueue(_Queue):
    def __init__(
        self,
        endpoint: str,
        bind: bool,
        ctx: zmq.Context | None = None,
        *,
        hwm: int = DEFAULT_HWM,
        linger_ms: int = DEFAULT_LINGER_MS,
        encoder: Callable[[Message], bytes] = encode,
    ) -> None:
        super().__init__(zmq.PUSH, endpoint, bind, ctx, hwm, linger_ms)
        self._encode = encoder

    def put(self, msg: Message, timeout_ms: int | None = 0) -> None:
        """Queue one message. timeout_ms=0: never block; None: wait for room. QueueFull if
        it cannot be queued in time; WireError if the message does not fit its schema."""
        frame = self._encode(msg)
        try:
            self.socket.send(frame, zmq.NOBLOCK, copy=False)
            return
        except zmq.Again:
            if timeout_ms == 0:
                raise QueueFull(f"{self.endpoint}: send queue full or no peer") from None
        if self.socket.poll(timeout_ms, zmq.POLLOUT):
            try:
                self.socket.send(frame, zmq.NOBLOCK, copy=False)
                return
            except zmq.Again:
                pass
        raise QueueFull(f"{self.endpoint}: no room after {timeout_ms} ms")


class RouterQueue(_Queue):
    """Bound; sends each message to one connected DealerQueue, named by its identity.
    Nothing is received on it."""

    def __init__(
        self,
        endpoint: str,
        ctx: zmq.Context | None = None,
        *,
        hwm: int = DEFAULT_HWM,
        linger_ms: int = DEFAULT_LINGER_MS,
    ) -> None:
        super().__init__(zmq.ROUTER, endpoint, True, ctx, hwm, linger_ms, {zmq.ROUTER_MANDATORY: 1})

    def put(self, peer: bytes, msg: Message) -> None:
        """Queue one message for `peer`, never blocking: QueueFull when that peer is not
        connected (not yet, or gone) or its queue is full; WireError as PushQueue.put."""
        frame = encode(msg)
        try:
            self.socket.send_multipart([peer, frame], zmq.NOBLOCK, copy=False)
        except zmq.Again:
            raise QueueFull(f"{self.endpoint}: {peer!r}'s queue is full") from None
        except zmq.ZMQError as e:
            if e.errno != zmq.EHOSTUNREACH:
                raise
            raise QueueFull(f"{self.endpoint}: {peer!r} is not connected") from None


class PullQueue(_Queue):
    KIND = zmq.PULL

    def __init__(
        self,
        endpoint: str,
        bind: bool,
        ctx: zmq.Context | None = None,
        *,
        hwm: int = DEFAULT_HWM,
        linger_ms: int = DEFAULT_LINGER_MS,
        decoder: Callable[[bytes], Message] = decode,
        options: dict[int, int | bytes] | None = None,
    ) -> None:
        super().__init__(self.KIND, endpoint, bind, ctx, hwm, linger_ms, options)
        self._decode = decoder
        self.num_dropped = 0

    def _recv_now(self) -> tuple[bool, Message | None]:
        """(got a frame, its message or None if dropped); never blocks."""
        try:
            parts = self.socket.recv_multipart(zmq.NOBLOCK)
        except zmq.Again:
            return False, None
        try:
            if len(parts) != 1:
                raise WireError(f"expected 1 frame, got a {len(parts)}-part message")
            return True, self._decode(parts[0])
        except WireError as e:
            self.num_dropped += 1
            log.warning(
                "dropped malformed frame on %s (%d bytes): %s",
                self.endpoint,
                sum(map(len, parts)),
                e,
            )
            return True, None

    def get(self, timeout_ms: int | None = None) -> Message | None:
        """The next valid message, waiting up to timeout_ms (None: forever); None on timeout."""
        deadline = None if timeout_ms is None else time.monotonic() + timeout_ms / 1000
        while True:
            got, msg = self._recv_now()
            if msg is not None:
                return msg
            if got:
                continue  # a dropped frame: look again without waiting
            left = None if deadline is None else max(0, int((deadline - time.monotonic()) * 1000))
            if not self.socket.poll(left, zmq.POLLIN) and left is not None:
                return None

    def drain(self, max_messages: int | None = None) -> list[Message]:
        """Every valid message already waiting (at most max_messages), without blocking."""
        out: list[Message] = []
        while max_messages is None or len(out) < max_messages:
            got, msg = self._recv_now()
            if not got:
                break
            if msg is not None:
                out.append(msg)
        return out

    def get_batch(self, timeout_ms: int | None = None) -> list[Message]:
        """Block once for the first message (up to timeout_ms), then drain the rest."""
        first = self.get(timeout_ms)
        return [] if first is None else [first, *self.drain()]


class DealerQueue(PullQueue):
    """A PullQueue that connects to a RouterQueue under `identity`, so that the sender
    picks which member of a pool gets each message; with `more`, to further ROUTERs too
    (one per frontend), whose messages are received fair-queued on this one socket."""

    KIND = zmq.DEALER

    def __init__(
        self,
        endpoint: str,
        identity: bytes,
        ctx: zmq.Context | None = None,
        *,
        hwm: int = DEFAULT_HWM,
        linger_ms: int = DEFAULT_LINGER_MS,
        more: tuple[str, ...] = (),
    ) -> None:
        super().__init__(
            endpoint,
            bind=False,
            ctx=ctx,
            hwm=hwm,
            linger_ms=linger_ms,
            options={zmq.ROUTING_ID: identity},
        )
        try:
            for ep in more:
                self.socket.connect(check_endpoint(ep))
        except BaseException:
            self.socket.close(linger=0)
            raise


class PeerWatch:
    """Notices at once that the process bound at a connecting socket's endpoint went away:
    its connection closes the moment it dies (ZMQ_EVENT_DISCONNECTED), long before a
    missed heartbeat would show it. Create it on the thread that owns `socket`; after
    that, only `gone()` and `close()` touch it, from one thread."""

    def __init__(self, socket: zmq.Socket) -> None:
        self._socket = socket
        self._monitor = socket.get_monitor_socket(zmq.EVENT_DISCONNECTED)

    def gone(self) -> bool:
        """Whether the peer disconnected since the last call; never blocks."""
        seen = False
        while not self._monitor.closed:
            try:
                event = parse_monitor_message(self._monitor.recv_multipart(zmq.NOBLOCK))
            except zmq.Again:
                break
            seen |= event["event"] == zmq.EVENT_DISCONNECTED
        return seen

    def close(self) -> None:
        if not self._monitor.closed:
            self._monitor.close(linger=0)
