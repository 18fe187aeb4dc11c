"""Every running request's block table in one array, a row per request (its slot), kept
between steps and written where a table changes (admission, a block added, blocks given
back), as vLLM v1's persistent batch keeps them. A step's inputs gather their rows with
one numpy index (graphs.StaticDecodeInputs.fill): the host's work a step then grows with
the rows that changed, not with each row's table (docs/benchmarks.md, "Host step").

    slot:   taken when a request starts running (Scheduler._admit), given back when it
            stops (finish, abort, preemption); at most max_num_seqs run at once
    array:  int32 [slots, width]; a row's first lengths[slot] entries are its table, the
            rest `pad` (a block no kernel reads past a row's context)
    width:  grows (doubling) when a table outgrows it: a few times a process
    version: counts the writes: a reader that copied the rows at one version (the decode
            graphs' static tables) copies them again only after a write

Request.block_table (a list) stays the scheduler's own record; every write to it goes
here too (Scheduler.set_blocks), and tests check that the two agree.
"""

from __future__ import annotations

import numpy as np

from scheduler_worker.backends.int_columns import int64_array


class BlockTables:
    def __init__(self, rows: int, pad: int, width: int = 16) -> None:
        self.pad = pad
        self.array = np.full((rows, width), pad, dtype=np.int32)
        self.lengths = np.zeros(rows, dtype=np.int32)
        self._free = list(range(rows - 1, -1, -1))  # the lowest slot first
        self.version = 0

    @property
    def width(self) -> int:
        return self.array.shape[1]

    def take(self) -> int:
        """A free slot (IndexError when every slot is taken: more running requests than
        the scheduler admits)."""
        return self._free.pop()

    def give(self, slot: int) -> None:
        """The slot's request stopped running: its row back to padding."""
        self.version += 1
        self.array[slot, : self.lengths[slot]] = self.pad
        self.lengths[slot] = 0
        self._free.append(slot)

    def write(self, slot: int, start: int, blocks: list[int]) -> None:
        """Entries start ... of the slot's table are `blocks` (its length: start + len, or
        what it was if longer: a window's blocks given back are overwritten in place)."""
        end = start + len(blocks)
        self.version += 1
        if end > self.width:
            self._grow(end)
        self.array[slot, start:end] = blocks
        if end > self.lengths[slot]:
            self.lengths[slot] = end

    def append(self, slots: list[int], blocks: list[int]) -> None:
        """Each slot's table one block longer, blocks[i] the new last entry of slots[i]'s
        (distinct slots): the step where many rows start a block at once, in one write."""
        idx = int64_array(slots)
        ends = self.lengths[idx]
        self.version += 1
        if len(idx) and int(ends.max()) + 1 > self.width:
            self._grow(int(ends.max()) + 1)
        self.array[idx, ends] = blocks
        self.lengths[idx] = ends + 1

    def _grow(self, end: int) -> None:
        grown = np.full((self.array.shape[0], max(end, 2 * self.width)), self.pad, np.int32)
        grown[:, : self.width] = self.array
        self.array = grown

    def row(self, slot: int) -> list[int]:
        """The slot's table, as a list (tests, checks)."""
        return self.array[slot, : self.lengths[slot]].tolist()
