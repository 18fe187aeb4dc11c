"""common.collector: a serving process's young collections come every several steps, not
several times a step, and a benchmark in a test's process puts the collector back."""

from __future__ import annotations

import gc

from common import collector


def _young_collections(make: int) -> int:
    """Young collections while `make` short-lived tuples are built, 1,500 alive at once
    (a decode step's outputs at 256 rows are a few thousand such)."""
    runs = []

    def count(phase: str, info: dict) -> None:
        if phase == "start" and info["generation"] == 0:
            runs.append(1)

    gc.callbacks.append(count)
    try:
        live: list[tuple] = []
        for i in range(make):
            live.append((i, [i]))
            if len(live) == 1500:
                live = []
    finally:
        gc.callbacks.remove(count)
    return len(runs)


def test_settle_keeps_a_steps_temporaries_out_of_the_collector_and_restore_undoes_it():
    before = gc.get_threshold()
    assert before[0] < collector.YOUNG_THRESHOLD  # the interpreter's default
    assert _young_collections(30_000) > 5  # the default's: several a step
    was = collector.settle()
    try:
        assert was == before
        assert gc.get_threshold() == (collector.YOUNG_THRESHOLD, *before[1:])
        assert gc.get_freeze_count() > 0  # start-up's objects: out of the collector
        assert _young_collections(30_000) <= 1
    finally:
        collector.restore(was)
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0
