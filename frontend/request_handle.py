"""One HTTP request's view of its engine sub-requests: the queue the dispatcher fills.

```
 inbox thread ─call_soon_threadsafe─▶ dispatcher ──Delta / APIError──▶ handle.queue ──next()──▶ route / SSE
 disconnect watcher, timeout timer (watch()) ─────── ClientDisconnected / APIError ──▲
```

OpenAI's `n` fans one HTTP request out into n sub-requests (rids `<id>-<i>`); they share
one handle and one queue, and `Delta.index` says which choice an output belongs to.

Invariant: once a sub-request's finishing Delta or its error is queued, nothing more is
queued for it — the dispatcher forgets the rid first, so late outputs are dropped there.
Everything here runs on the event loop thread.

A consumer that falls behind (a busy event loop, a slow client) gets the outputs of one
choice that are already waiting merged into one Delta (`next()`, vLLM's
RequestOutputCollector): one SSE event for several engine steps instead of one each, so a
saturated frontend sends fewer, larger events rather than falling further behind. A
consumer that keeps up sees each step's output on its own, as before.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any

from common.messages import join_outputs
from frontend.errors import APIError

Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]  # ASGI receive


@dataclass(slots=True)
class Delta:
    """One TextOutputs entry for one sub-request: the text produced by one engine step."""

    index: int
    text: str
    finish_reason: str | None  # "stop" | "length" | "abort" | None (still running)
    stop_reason: str | int | None  # the matched stop string or stop_token_ids entry
    num_prompt_tokens: int
    num_output_tokens: int  # total so far
    token_ids: bytes  # pack_ids of this step's tokens
    logprobs: list | None  # per new token: [logprob, [[token_id, logprob], ...]]
    timings: dict[str, Any] | None
    # with the first output of a request that asked (echo + logprobs): per prompt token
    # [logprob (None for the first), [[token_id, logprob], ...], [token str, top strs...]]
    prompt_logprobs: list | None = None
    # with the finishing output: the prompt tokens served from the prefix cache (the
    # scheduler's count, in its timings)
    num_cached_tokens: int = 0
    # with --reasoning-parser (frontend.reasoning): the step's reasoning text, moved out of
    # `text`, and the output tokens so far that were reasoning
    reasoning: str = ""
    num_reasoning_tokens: int = 0
    # with the finishing output of a request with a prediction (frontend.prediction):
    # (accepted_prediction_tokens, rejected_prediction_tokens)
    prediction: tuple[int, int] | None = None


def merged(a: Delta, b: Delta) -> Delta:
    """Two outputs of one choice, a then b, as one: b's counts and finish, both texts,
    token ids, logprobs and reasoning; the prompt's logprobs (first output only) and,
    where b has none, the timings from a."""
    out = join_outputs(a, b, ("text", "token_ids", "logprobs", "reasoning"))
    if out.timings is None:
        out.timings = a.timings
    return out


def mergeable(a: Delta, b: Delta) -> bool:
    """b (queued after a, same choice) can join a: a is not the choice's last output, b
    carries no prompt logprobs, and both have logprobs or neither."""
    return (
        a.finish_reason is None
        and b.prompt_logprobs is None
        and (a.logprobs is None) == (b.logprobs is None)
    )


class OutputQueue:
    """The handle's queue: the dispatcher appends (put_nowait), the consumer awaits get();
    `items` is open to take_merged."""

    __slots__ = ("items", "_waiter")

    def __init__(self) -> None:
        self.items: deque[Delta | Exception] = deque()
        self._waiter: asyncio.Future[None] | None = None

    def put_nowait(self, item: Delta | Exception) -> None:
        self.items.append(item)
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    def empty(self) -> bool:
        return not self.items

    def qsize(self) -> int:
        return len(self.items)

    async def get(self) -> Delta | Exception:
        while not self.items:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        return self.items.popleft()

    def take_merged(self, d: Delta) -> Delta:
        """d with every output of its choice queued behind it merged in, up to the first
        error or an output that cannot join (mergeable); the others stay, in order."""
        items, kept = self.items, []
        while items:
            x = items[0]
            if isinstance(x, Exception):
                break
            items.popleft()
            if x.index != d.index:
                kept.append(x)
            elif mergeable(d, x):
                d = merged(d, x)
            else:
                kept.append(x)
                break
        items.extendleft(reversed(kept))
        return d


class ClientDisconnected(Exception):
    """The HTTP client went away; its sub-requests were already aborted."""


class RequestHandle:
    def __init__(
        self,
        rids: list[str],
        arrival: float,
        timeout_s: float,
        aliases: dict[str, str] | None = None,
        return_timings: bool = False,
        arrival_wall: float | None = None,
    ) -> None:
        self.rids = rids
        self.arrival = arrival  # time.monotonic() when the HTTP request arrived
        # the same moment by the wall clock, the start of the stage times (`timings`): the
        # workers' stamps are wall-clock; the arrival stays here and is not sent out
        self.arrival_wall = (
            time.time() - (time.monotonic() - arrival) if arrival_wall is None else arrival_wall
        )
        self.timeout_s = timeout_s
        self.return_timings = return_timings  # the client asked for its stage times
        self.queue = OutputQueue()
        self.num_finished = 0  # finishing Deltas handed to the consumer
        n = len(rids)
        # dispatcher-side progress, for the latency histograms
        self.first_token_at: list[float | None] = [None] * n
        self.last_token_at: list[float] = [0.0] * n
        self.num_output_tokens: list[int] = [0] * n
        self.num_prompt_tokens: list[int] = [0] * n  # known from the first output on
        self.watcher: asyncio.Task | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.released = False
        self.replica = 0  # the scheduler replica its sub-requests went to
        self.aliases = aliases or {}  # for worker errors: see EngineClient.submit

    @property
    def n(self) -> int:
        return len(self.rids)

    @property
    def done(self) -> bool:
        """Every sub-request's finishing Delta has been consumed."""
        return self.num_finished == len(self.rids)

    def ready(self) -> bool:
        """An output is waiting: next() will not block."""
        return not self.queue.empty()

    async def next(self) -> Delta:
        """The next output of any sub-request, with the outputs of its choice that are
        already waiting merged in. Raises APIError (a worker's RequestError, timeout,
        shutdown) or ClientDisconnected."""
        item = await self.queue.get()
        if isinstance(item, Exception):
            raise item
        if self.queue.items and item.finish_reason is None:
            item = self.queue.take_merged(item)
        if item.finish_reason is not None:
            self.num_finished += 1
        return item

    def watch(
        self, interrupt: Callable[[RequestHandle, str, Exception], None], receive: Receive | None
    ) -> None:
        """Start the timeout timer and, given the ASGI `receive`, the disconnect watcher;
        either calls interrupt(self, reason, exc), which aborts what still runs and wakes
        the consumer with exc. cancel_watchers() stops both."""
        timeout = APIError(
            504, f"request timed out after {self.timeout_s:g} s", "server_error", None, "timeout"
        )
        self.timer = asyncio.get_running_loop().call_later(
            self.timeout_s, interrupt, self, "timeout", timeout
        )
        if receive is not None:
            self.watcher = asyncio.ensure_future(self._watch_disconnect(interrupt, receive))

    async def _watch_disconnect(
        self, interrupt: Callable[[RequestHandle, str, Exception], None], receive: Receive
    ) -> None:
        """Wait for the ASGI http.disconnect (the body was read already), then interrupt."""
        try:
            while (await receive())["type"] != "http.disconnect":
                pass
        except Exception:  # receive() failing means the connection is unusable anyway
            pass
        self.watcher = None  # finished: nothing to cancel
        interrupt(self, "client_disconnect", ClientDisconnected())

    def cancel_watchers(self) -> None:
        if self.watcher is not None:
            self.watcher.cancel()
            self.watcher = None
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
