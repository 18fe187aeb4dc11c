"""The cyclic garbage collector as a serving process runs it.

At start-up's end, `settle()` collects once, freezes what start-up built (modules, the
model, tokenizers: never walked again) and raises the youngest generation's threshold.

The default threshold (700 net new container objects) ran a young collection one or more
times a decode step: the scheduler's step at 256 rows makes a few thousand short-lived
tuples and lists (each row's output, its (request, index) pair), and each collection
walked the ones still alive and promoted them a generation up, to die there. That was ~6%
of the host's step in instructions (docs/benchmarks.md, "The host step in instructions").
At YOUNG_THRESHOLD a collection comes every several steps, and by then a step's
temporaries are gone: it walks only what lives on. Cycles are still collected, a little
later, so the garbage they hold stays bounded by the threshold.
"""

from __future__ import annotations

import gc

YOUNG_THRESHOLD = 50_000  # net new container objects between young collections


def settle() -> tuple[int, int, int]:
    """Collect, freeze the survivors out of the collector, raise the young threshold (the
    older generations' stay); returns the thresholds before, for `restore`."""
    gc.collect()
    gc.freeze()
    before = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, *before[1:])
    return before


def restore(before: tuple[int, int, int]) -> None:
    """Undo `settle` (a benchmark in a test's process): the frozen objects back in the
    collector, the thresholds as they were."""
    gc.unfreeze()
    gc.set_threshold(*before)
