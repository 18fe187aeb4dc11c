"""Which scheduler replica serves a request: least loaded, with prefix affinity.

    load(r) = 4 * (waiting + pending) + running     (vLLM's data-parallel rule); ties go to
                                                     the lower KV usage, then the lower id
    pending = requests the frontend routed to r that its last heartbeat does not show
              (open here - (waiting + running) there, at least 0): a burst between two
              heartbeats is spread, not all sent to the replica that looked idle

Prefix affinity (SGLang's cache-aware routing, reduced to one key): requests whose
prompts share their first full KV block go to the replica that prefix first went to (its
home), so that replica's prefix cache serves them, unless the home is over the imbalance
threshold: load > max(least load + AFFINITY_SLACK, AFFINITY_RATIO * least load). Then the
least loaded takes that request and the prefix keeps its home (moving it would scatter
the prefix over every replica under load); a home that is gone is replaced. Routing happens
before tokenizing (the tokenizer worker sends the request to the chosen replica), so the
key is the prompt's text (or ids) that a KV block covers, not its tokens
(`prefix_key`); a prompt shorter than that has no key and goes by load alone.
`round_robin` (server.routing) ignores load and prefixes: the baseline benchmarks
compare against.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass

AFFINITY_SLACK = 32  # eight queued requests
AFFINITY_RATIO = 1.5
MAX_PREFIXES = 65_536  # affinity entries kept, least recently used dropped
CHARS_PER_TOKEN = 4  # a full KV block of text: block_size * this many characters


@dataclass(frozen=True, slots=True)
class ReplicaLoad:
    replica: int
    num_waiting: int  # from its last heartbeat
    num_running: int
    kv_usage: float
    num_open: int  # sub-requests the frontend routed to it and still waits on

    @property
    def score(self) -> int:
        pending = max(0, self.num_open - self.num_waiting - self.num_running)
        return 4 * (self.num_waiting + pending) + self.num_running


def prefix_key(text: str | None, ids: list[int] | None, block_size: int) -> bytes | None:
    """The key of a prompt's first full KV block: its first block_size token ids, or the
    first block_size * CHARS_PER_TOKEN characters of its text; None when shorter."""
    if ids is not None:
        head = ids[:block_size]
        return None if len(head) < block_size else hashlib.blake2b(repr(head).encode()).digest()
    n = block_size * CHARS_PER_TOKEN
    if text is None or len(text) < n:
        return None
    return hashlib.blake2b(text[:n].encode()).digest()


class Router:
    def __init__(self, policy: str = "least_loaded") -> None:
        self.policy = policy
        self.last: OrderedDict[bytes, int] = OrderedDict()  # prefix key -> replica
        self.num_picked = 0

    def pick(self, loads: list[ReplicaLoad], key: bytes | None = None) -> int:
        """The replica for one request among `loads` (the live replicas; not empty)."""
        self.num_picked += 1
        if self.policy == "round_robin":
            return sorted(r.replica for r in loads)[self.num_picked % len(loads)]
        best = min(loads, key=lambda r: (r.score, r.kv_usage, r.replica))
        choice = best.replica
        if key is not None:
            home = self.last.get(key)
            r = next((r for r in loads if r.replica == home), None)
            if r is None:  # a new prefix, or its replica is gone: it lives where it goes now
                self.last[key] = choice
            elif r.score <= max(best.score + AFFINITY_SLACK, AFFINITY_RATIO * best.score):
                choice = r.replica
            # else: too busy this time; the least loaded takes it, the prefix keeps its home
            self.last.move_to_end(key)
            if len(self.last) > MAX_PREFIXES:
                self.last.popitem(last=False)
        return choice
