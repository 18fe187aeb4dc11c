"""Which tokenizer worker holds which request: ZeroMQ's PUSH pipe gives no word of which
worker takes a request, so the workers say so (common.messages.TokenizeAck):

```
 submitted ──ack(pid)──▶ taken by pid ──ack(done)──▶ forgotten (the scheduler has it)
     │                        │
     └─ no ack in grace_s ────┴─ pid died ──▶ lost(): the frontend fails it with 503
```
Outputs, errors and aborts for a rid also forget it. Pure bookkeeping: callers pass `now`.
"""

from __future__ import annotations

from common.messages import TokenizeAck

ACK_GRACE_S = 0.5  # a live tokenizer takes a request off its pipe well within this


class TokenizerHandoffs:
    def __init__(self) -> None:
        self.unacked: dict[str, float] = {}  # rid -> when it was sent, until a worker takes it
        self.taken: dict[str, int] = {}  # rid -> pid of the worker that took it
        self._lost_pids: set[int] = set()  # dead workers already accounted for

    def __bool__(self) -> bool:
        return bool(self.unacked or self.taken)

    def sent(self, rid: str, now: float) -> None:
        self.unacked[rid] = now

    def forget(self, rid: str) -> None:
        """rid is past the tokenizers (output, error or abort): nothing to watch."""
        self.unacked.pop(rid, None)
        self.taken.pop(rid, None)

    def on_ack(self, msg: TokenizeAck) -> None:
        for rid in msg.rids:
            if msg.done:
                self.taken.pop(rid, None)
            elif self.unacked.pop(rid, None) is not None:
                self.taken[rid] = msg.pid

    def newly_dead(self, dead: set[int]) -> set[int]:
        """Of the `dead` worker pids, those not reported before."""
        new = dead - self._lost_pids
        self._lost_pids |= new
        return new

    def prune(self, known: set[int]) -> None:
        """Forget dead pids liveness no longer tracks (`known`: the pids it does)."""
        self._lost_pids &= known

    def lost(
        self,
        now: float,
        dead: set[int] | frozenset[int] = frozenset(),
        grace_s: float = ACK_GRACE_S,
    ) -> list[str]:
        """Forget and return the rids a dead or hung worker holds: those no worker took
        within grace_s (in its pipe: a live worker takes its whole pipe at every loop) and
        those a `dead` worker took but never passed on."""
        rids = [rid for rid, t in self.unacked.items() if now - t > grace_s]
        rids += [rid for rid, pid in self.taken.items() if pid in dead]
        for rid in rids:
            self.forget(rid)
        return rids
