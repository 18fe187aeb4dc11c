"""The GPU's own account of a run: how long it spent in the steps' forwards, and how long it
sat between two forwards of one overlapped run, from events recorded around each forward
on the step's stream and read once the device has passed them (never waited on).

    busy_s   sum over steps of (forward's start event -> its end event)
    wait_s   sum over chained steps of (the previous forward's end -> this one's start)

A step is chained when it was launched while the step before it was still in flight
(overlapped scheduling: LLMEngine sets `Backend.chained`). Between two chained forwards the
device runs the previous step's sampling and token copy; anything more is the device
waiting for the host to launch the next one, so wait_s over the wall clock is the share of
a busy run the host costs the GPU (issue 38's "GPU busy" target: the rest is busy_s, or the
engine with nothing to run). Exported as EngineStatus.busy "device" and "device_wait"
(`zeroserve:scheduler_busy_seconds{part=...}`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

Event = Any  # torch.cuda.Event, or a test's stand-in with record / query / elapsed_time


class DeviceClock:
    def __init__(self, new_event: Callable[[], Event]) -> None:
        self.new_event = new_event  # an event with timing enabled
        self.busy_s = 0.0
        self.wait_s = 0.0
        self.steps = 0  # forwards read back
        self._queued: deque[tuple[Event | None, Event, Event]] = deque()
        self._last_end: Event | None = None

    def start(self, chained: bool) -> tuple[Event | None, Event]:
        """Before a forward's first kernel: (the previous forward's end if chained, start)."""
        start = self.new_event()
        start.record()
        return (self._last_end if chained else None, start)

    def end(self, started: tuple[Event | None, Event]) -> None:
        """After the forward's last kernel: queue its events, and add up every queued
        forward the device has passed (in stream order: stop at the first it has not)."""
        prev_end, start = started
        end = self.new_event()
        end.record()
        self._queued.append((prev_end, start, end))
        self._last_end = end
        self.collect()

    def collect(self) -> None:
        queued = self._queued
        while queued and queued[0][2].query():
            prev_end, start, end = queued.popleft()
            self.busy_s += start.elapsed_time(end) / 1000.0
            if prev_end is not None:
                self.wait_s += prev_end.elapsed_time(start) / 1000.0
            self.steps += 1
