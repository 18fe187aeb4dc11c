"""Each drafting row's sequence in a draft model's KV pool (draft_model.py), kept from one
proposal to the next as the target keeps the row's own KV.

    the row's tokens  [ t0 ................................ t(n-1) ]
    draft KV          [ t0 ................ t(n-1) | d1 .. dj ]        after a proposal at n
                      0                       known = n      num_computed = n + j

The target then verifies: the row has n' > n tokens, and the draft's K/V holds as far as
they agree with d1..dj (sync): num_computed rolls back to there. The refused drafts' K/V
lies past num_computed, overwritten by the next proposal; their blocks stay in the
sequence's table for its next tokens, as the target keeps a refused draft's. A row's
last token is always computed again: its logits give the next proposal's d1.

Invariants (check): a sequence's blocks cover num_computed tokens and its slot's row of
`tables` is its block table; its first num_hashed blocks are registered in the pool's
prefix cache, with the row's tokens only (never a draft); an ended sequence's blocks are
back in the pool, its slot free.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from scheduler_worker.backends.block_tables import BlockTables
from scheduler_worker.block_manager import BlockManager


@dataclass
class DraftSeq:
    slot: int  # its row of DraftSeqs.tables
    block_table: list[int]
    num_computed: int  # positions with K/V in the draft pool
    known: int  # positions < known hold the row's own tokens
    drafts: list[int] = field(default_factory=list)  # K/V at known...: the last proposal's
    num_hashed: int = 0


class DraftSeqs:
    def __init__(self, blocks: BlockManager, rows: int) -> None:
        """blocks: the draft pool's; rows: the target's running requests, at most."""
        self.blocks = blocks
        self.block_size = blocks.block_size
        # a DecodeRows step reads tables by slot; pad: the runner's scratch block
        self.tables = BlockTables(rows, pad=blocks.num_blocks)
        self.seqs: dict[str, DraftSeq] = {}

    def sync(self, request_id: str, tokens: list[int]) -> DraftSeq:
        """The row's sequence, its K/V rolled back to the longest prefix that is `tokens`'
        (never past its last token); a new one starts from the pool's prefix cache."""
        seq = self.seqs.get(request_id)
        if seq is None:
            blocks, cached = self.blocks.match_prefix(tokens)
            seq = DraftSeq(self.tables.take(), blocks, cached, cached, num_hashed=len(blocks))
            self.tables.write(seq.slot, 0, blocks)
            self.seqs[request_id] = seq
            return seq
        at, drafts, m = seq.known, seq.drafts, 0
        while m < len(drafts) and at + m < len(tokens) and tokens[at + m] == drafts[m]:
            m += 1
        seq.num_computed = seq.known = min(at + m, len(tokens) - 1)
        seq.drafts = []
        if seq.known // self.block_size > seq.num_hashed:  # a block of the row's tokens filled
            seq.num_hashed = self.blocks.cache_full_blocks(
                seq.block_table, tokens, seq.num_hashed, seq.known
            )
        return seq

    def reserve(self, seq: DraftSeq, num_tokens: int) -> bool:
        """Blocks for the sequence's first num_tokens; False (nothing taken) when the pool
        has not enough free: the row drafts nothing this step."""
        need = -(-num_tokens // self.block_size) - len(seq.block_table)
        if need <= 0:
            return True
        if not self.blocks.can_allocate(need):
            return False
        blocks = self.blocks.allocate(need)
        self.tables.write(seq.slot, len(seq.block_table), blocks)
        seq.block_table.extend(blocks)
        return True

    def drop(self, request_id: str) -> None:
        """The row stopped running: its blocks back to the pool (the registered ones stay
        in its prefix cache until evicted), its slot free."""
        seq = self.seqs.pop(request_id, None)
        if seq is not None:
            self.blocks.free(seq.block_table)
            self.tables.give(seq.slot)

    def check(self) -> None:
        """The invariants of the module docstring (tests)."""
        self.blocks.check_integrity()
        for rid, seq in self.seqs.items():
            assert len(seq.block_table) * self.block_size >= seq.num_computed, rid
            assert seq.known <= seq.num_computed == seq.known + len(seq.drafts), rid
            assert self.tables.row(seq.slot) == seq.block_table, rid
            assert seq.num_hashed * self.block_size <= seq.known, rid
        used = sorted(s.slot for s in self.seqs.values())
        assert len(set(used)) == len(used), "two sequences share a slot"
