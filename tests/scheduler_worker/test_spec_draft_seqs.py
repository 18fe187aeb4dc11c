"""A draft model's per-row sequences (spec/draft_seqs.py): rolled back to the prefix the
target accepted, never past a row's last token; a row that cannot get blocks takes none;
only the row's own tokens enter the prefix cache; a dropped row's blocks and slot go
back, and a new row starts from the prefix cache."""

from __future__ import annotations

from scheduler_worker.block_manager import BlockManager
from scheduler_worker.spec.draft_seqs import DraftSeqs

BS = 4


def _propose(kv: DraftSeqs, rid: str, tokens: list[int], drafts: list[int]) -> None:
    """What DraftModelDrafter.propose_batch does to a sequence: catch up to the row's
    tokens, then K/V for drafts[:-1] (the last draft is never computed)."""
    seq = kv.sync(rid, tokens)
    assert kv.reserve(seq, len(tokens) + len(drafts) - 1)
    seq.num_computed = seq.known = len(tokens)
    for d in drafts[:-1]:
        seq.drafts.append(d)
        seq.num_computed += 1
    kv.check()


def test_rollback_to_the_accepted_prefix():
    kv = DraftSeqs(BlockManager(16, BS), rows=2)
    row = list(range(10, 16))  # 6 tokens
    _propose(kv, "a", row, [20, 21, 22, 23])  # K/V: row + 20 21 22
    seq = kv.seqs["a"]
    assert (seq.num_computed, seq.known) == (9, 6)
    # the target accepted 20 and 21, then sampled 30: K/V valid up to 21
    row += [20, 21, 30]
    assert kv.sync("a", row).num_computed == 8
    assert seq.drafts == [] and seq.known == 8
    # all drafts accepted and the bonus token: the last token is computed again
    _propose(kv, "a", row, [40, 41])  # K/V: row + 40
    row += [40, 41, 42]
    assert kv.sync("a", row).num_computed == 10  # row[:10] = ... 40: 41 and 42 to compute
    # nothing accepted
    _propose(kv, "a", row, [50, 51, 52])
    row += [60]
    assert kv.sync("a", row).num_computed == 12
    # a row whose K/V already holds all its tokens (a cheaper drafter's step accepted
    # exactly the draft model's d1): its last token is computed again, for its logits
    _propose(kv, "a", row, [70, 71])
    row += [70]
    assert kv.sync("a", row).num_computed == len(row) - 1
    kv.check()


def test_only_the_rows_tokens_enter_the_prefix_cache():
    blocks = BlockManager(16, BS)
    kv = DraftSeqs(blocks, rows=2)
    row = list(range(100, 107))  # 7 tokens
    _propose(kv, "a", row, [1, 2, 3, 4])  # K/V to position 9: drafts fill block 1
    assert kv.seqs["a"].num_hashed == 0
    row += [1, 9]  # 1 accepted, 9 instead of 2
    kv.sync("a", row)  # known: 8 tokens, row[:8]: two full blocks of the row's own
    assert kv.seqs["a"].num_hashed == 2
    kv.drop("a")
    assert blocks.num_free_blocks == 16
    # a new row with the same start takes those two blocks back (its last token aside)
    seq = kv.sync("b", row[:8] + [5])
    assert (seq.num_computed, seq.num_hashed) == (8, 2)
    # one that differs within block 1 takes only block 0
    assert kv.sync("c", row[:6] + [0, 0, 0]).num_computed == 4
    kv.check()


def test_a_row_without_blocks_takes_none_and_drop_frees_all():
    blocks = BlockManager(3, BS)
    kv = DraftSeqs(blocks, rows=2)
    a = kv.sync("a", list(range(9)))
    assert kv.reserve(a, 12)  # 3 blocks: the pool
    b = kv.sync("b", list(range(50, 55)))
    assert not kv.reserve(b, 6) and b.block_table == [] and blocks.num_free_blocks == 0
    assert kv.tables.row(b.slot) == []
    kv.drop("a")
    assert kv.reserve(b, 6) and len(b.block_table) == 2
    kv.check()
    kv.drop("b")
    kv.drop("b")  # idempotent: a row ends once, but finish may follow a preemption's drop
    assert blocks.num_free_blocks == 3 and not kv.seqs
    assert sorted([kv.tables.take(), kv.tables.take()]) == [0, 1]  # both slots free again
