"""The frontend's sockets to the scheduler replicas: one PUSH per replica's inbox, connected
when it joins (again when it rejoins at another inbox), each watched (PeerWatch) for a
sudden death, and a probe connected to the detok only to watch it. The inbox thread reads
the watches (`gone`): the table is replaced on a change, never changed in place, and a
replaced socket and its watch are closed only at the end."""

from __future__ import annotations

import zmq

from common.config import IPCConfig
from common.messages import Message
from common.zmq_queue import PeerWatch, PushQueue, QueueFull


class ReplicaLinks:
    def __init__(self, ctx: zmq.Context, ipc: IPCConfig) -> None:
        self.ctx, self.ipc = ctx, ipc
        self.sockets: dict[int, PushQueue] = {}  # replica -> socket to its inbox
        self._old_sockets: list[PushQueue] = []  # a rejoined replica's old inbox
        self._detok_probe = PushQueue(ipc.endpoint("detok"), bind=False, ctx=ctx)
        self._watches: dict[str, PeerWatch] = {"detok": PeerWatch(self._detok_probe.socket)}
        self._old_watches: list[PeerWatch] = []

    def connect(self, replica: int, inbox: str | None) -> None:
        """A replica joined (or rejoined at another inbox): connect to its inbox and watch
        the connection."""
        ep = inbox or self.ipc.replica_endpoint(replica)
        old = self.sockets.get(replica)
        if old is not None and old.endpoint == ep:
            return
        q = PushQueue(ep, bind=False, ctx=self.ctx)
        key = f"scheduler.{replica}"
        if old is not None:  # the inbox thread may still read its watch: closed at the end
            self._old_sockets.append(old)
            self._old_watches.append(self._watches[key])
        self.sockets[replica] = q
        self._watches = {**self._watches, key: PeerWatch(q.socket)}

    def endpoint(self, replica: int) -> str | None:
        q = self.sockets.get(replica)
        return None if q is None else q.endpoint

    def gone(self) -> list[str]:
        """The components whose connection closed since the last call (the inbox thread)."""
        return [name for name, watch in self._watches.items() if watch.gone()]

    def send(self, replica: int, msg: Message) -> bool:
        """False when the replica's queue is full (a replica not connected: True, nothing
        to send to)."""
        q = self.sockets.get(replica)
        if q is None or q.socket.closed:
            return True
        try:
            q.put(msg)
            return True
        except QueueFull:
            return False

    def send_all(self, msg: Message) -> bool:
        """To every replica (the frontend's heartbeat)."""
        return all([self.send(k, msg) for k in list(self.sockets)])

    def close(self) -> None:
        for watch in [*self._watches.values(), *self._old_watches]:
            watch.close()
        for q in (self._detok_probe, *self.sockets.values(), *self._old_sockets):
            q.close()
