from __future__ import annotations

import random

import pytest

from scheduler_worker import block_manager
from scheduler_worker.block_manager import BlockManager, NoFreeBlocksError

BS = 4


def _run(bm: BlockManager, tokens: list[int]) -> list[int]:
    """Admit a request like the scheduler does: prefix hit, allocate the rest, compute all
    tokens, hash the full blocks. Returns its block table."""
    blocks, num_cached = bm.match_prefix(tokens)
    assert num_cached == len(blocks) * BS
    table = blocks + bm.allocate(-(-len(tokens) // BS) - len(blocks))
    assert bm.cache_full_blocks(table, tokens, len(blocks)) == len(tokens) // BS
    return table


def _seq(*block_tokens: int, tail: int = 1) -> list[int]:
    """One full block per argument (the value repeated), then `tail` extra tokens."""
    out = [t for b in block_tokens for t in [b] * BS]
    return out + [99] * tail


def test_allocate_free_accounting():
    bm = BlockManager(10, BS)
    assert (bm.num_free_blocks, bm.num_used_blocks, bm.usage) == (10, 0, 0.0)
    a = bm.allocate(4)
    assert len(set(a)) == 4 and bm.num_free_blocks == 6 and bm.num_used_blocks == 4
    assert bm.usage == pytest.approx(0.4)
    assert bm.allocate(0) == []
    assert bm.can_allocate(6) and not bm.can_allocate(7)
    with pytest.raises(NoFreeBlocksError):
        bm.allocate(7)
    assert bm.num_free_blocks == 6  # a failed allocation takes nothing
    b = bm.allocate(6)
    assert set(a).isdisjoint(b) and bm.num_free_blocks == 0 and bm.usage == 1.0
    bm.free(a)
    bm.free(b)
    assert bm.num_free_blocks == 10
    bm.check_integrity()


def test_double_free_raises():
    bm = BlockManager(4, BS)
    a = bm.allocate(2)
    bm.free(a)
    with pytest.raises(RuntimeError, match="double free"):
        bm.free(a)
    b = bm.allocate(1)
    with pytest.raises(RuntimeError, match="double free"):
        bm.free([b[0], b[0]])


def test_shared_blocks_freed_by_last_owner():
    bm = BlockManager(4, BS)
    a = bm.allocate(2)
    bm.incref(a)
    bm.free(a)
    assert bm.num_free_blocks == 2  # still held once
    bm.incref(a[:1])
    bm.free(a)
    assert bm.num_free_blocks == 3
    bm.free(a[:1])
    assert bm.num_free_blocks == 4
    bm.check_integrity()


def test_prefix_hit_reuses_cached_free_blocks():
    bm = BlockManager(16, BS)
    tokens = _seq(1, 2, 3)
    table = _run(bm, tokens)
    bm.free(table)
    assert bm.num_free_blocks == 16
    blocks, num_cached = bm.match_prefix(tokens)
    assert blocks == table[:3] and num_cached == 3 * BS
    assert bm.num_free_blocks == 13 and all(bm.ref_counts[b] == 1 for b in blocks)
    bm.check_integrity()
    # a second request shares them
    again, _ = bm.match_prefix(tokens + [5, 6])
    assert again == blocks and all(bm.ref_counts[b] == 2 for b in blocks)
    bm.free(blocks)
    bm.free(again)
    assert bm.num_free_blocks == 16
    bm.check_integrity()


def test_match_leaves_at_least_one_token():
    bm = BlockManager(16, BS)
    table = _run(bm, _seq(1, 2, 3, tail=0))  # exactly three full blocks
    blocks, num_cached = bm.match_prefix(_seq(1, 2, 3, tail=0))
    assert blocks == table[:2] and num_cached == 2 * BS
    bm.free(blocks)
    blocks, _ = bm.match_prefix(_seq(1, 2, 3, tail=1))
    assert blocks == table[:3]
    bm.free(blocks)
    assert bm.match_prefix(_seq(1, tail=0)[:1]) == ([], 0)
    assert bm.match_prefix([]) == ([], 0)


def test_hashes_are_chained():
    bm = BlockManager(16, BS)
    a = _run(bm, _seq(1, 2, 3))
    # same second and third block after a different first block: no hit at all
    assert bm.match_prefix(_seq(7, 2, 3)) == ([], 0)
    # same first block, different second: only the first hits
    blocks, n = bm.match_prefix(_seq(1, 8, 3))
    assert blocks == a[:1] and n == BS
    bm.free(blocks)
    bm.check_integrity()


def test_hash_collision_never_hits(monkeypatch):
    monkeypatch.setattr(block_manager, "chain_hash", lambda parent, tokens: 42)
    bm = BlockManager(16, BS)
    a = _run(bm, _seq(1, 2))  # both blocks hash to 42: only the first is registered
    bm.check_integrity()
    assert bm.match_prefix(_seq(5, 2)) == ([], 0)  # 42 maps to block (1,1,1,1): tokens differ
    blocks, _ = bm.match_prefix(_seq(1, 2))
    assert blocks == a[:1]  # the second lookup finds block (1,..) again: tokens differ
    bm.free(blocks)
    bm.free(a)
    bm.check_integrity()


def test_parent_is_compared_on_hit(monkeypatch):
    # a hash that ignores the parent: block (2,..) after (1,..) collides with (2,..) after (3,..)
    monkeypatch.setattr(block_manager, "chain_hash", lambda parent, tokens: hash(tokens))
    bm = BlockManager(16, BS)
    c = _run(bm, _seq(3, 2))
    a = _run(bm, _seq(1, 2))
    blocks, _ = bm.match_prefix(_seq(1, 2))
    assert blocks == a[:1] and c[1] not in blocks
    bm.free(blocks)
    bm.check_integrity()


def test_incremental_caching_chains_across_calls():
    bm = BlockManager(16, BS)
    tokens = _seq(1, 2, 3, 4, tail=2)
    table = bm.allocate(5)
    assert bm.cache_full_blocks(table, tokens[:3], 0) == 0  # no full block yet
    assert bm.cache_full_blocks(table, tokens[:6], 0) == 1
    assert bm.cache_full_blocks(table, tokens[:6], 1) == 1  # nothing new
    assert bm.cache_full_blocks(table, tokens[:13], 1) == 3
    assert bm.cache_full_blocks(table, tokens, 3) == 4
    blocks, _ = bm.match_prefix(tokens)
    assert blocks == table[:4]
    # the same chain from the whole list and a count of known tokens (no slice copied)
    by_count = BlockManager(16, BS)
    other = by_count.allocate(5)
    for known, hashed in ((3, 0), (6, 0), (6, 1), (13, 1), (len(tokens) + 9, 3)):
        by_count.cache_full_blocks(other, tokens, hashed, known)
    assert [by_count.block_hash[b] for b in other] == [bm.block_hash[b] for b in table]
    assert by_count.cache_full_blocks(other, tokens, 0, 13) == 3  # the known count bounds it
    bm.free(blocks)
    bm.free(table)
    bm.check_integrity()


def test_lru_eviction_order():
    bm = BlockManager(6, BS)
    a = _run(bm, _seq(1, 2, 3, tail=0))
    b = _run(bm, _seq(4, 5, 6, tail=0))
    bm.free(a)
    bm.free(b)
    # least recently freed first; within a request, its tail first
    assert list(bm.free_blocks) == a[::-1] + b[::-1]
    assert bm.allocate(1) == [a[2]]  # evicted: its hash is gone
    blocks, _ = bm.match_prefix(_seq(1, 2, 3))
    assert blocks == a[:2]  # the head of a survived
    assert bm.allocate(2) == [b[2], b[1]]
    bm.check_integrity()


def test_partial_tail_block_goes_first():
    bm = BlockManager(5, BS)
    table = _run(bm, _seq(1, 2, 3, tail=2))  # 3 hashed blocks + a partial one
    spare = next(iter(bm.free_blocks))  # never used
    bm.free(table)
    assert list(bm.free_blocks)[:2] == [table[3], spare]
    assert bm.allocate(2) == [table[3], spare]
    blocks, _ = bm.match_prefix(_seq(1, 2, 3))
    assert blocks == table[:3]  # no cached block was evicted
    bm.check_integrity()


def test_duplicate_block_stays_unregistered_then_takes_over():
    bm = BlockManager(8, BS)
    tokens = _seq(1, 2)
    # two requests compute the same prompt before either is cached
    a = bm.allocate(3)
    b = bm.allocate(3)
    assert bm.cache_full_blocks(a, tokens, 0) == 2
    assert bm.cache_full_blocks(b, tokens, 0) == 2
    assert {bm.hash_to_block[bm.block_hash[x]] for x in b[:2]} == set(a[:2])
    bm.check_integrity()
    bm.free(a)
    bm.allocate(bm.num_free_blocks)  # evict everything free, a's blocks included
    bm.free(b)  # b's blocks now carry the cached prefix
    blocks, _ = bm.match_prefix(tokens)
    assert blocks == b[:2]
    bm.check_integrity()


def test_counters_and_disabled_caching():
    bm = BlockManager(16, BS)
    tokens = _seq(1, 2, tail=3)  # 11 tokens
    table = _run(bm, tokens)
    assert (bm.prefix_cache_queries, bm.prefix_cache_hits) == (11, 0)
    blocks, n = bm.match_prefix(tokens)
    assert n == 8 and (bm.prefix_cache_queries, bm.prefix_cache_hits) == (22, 8)
    bm.free(blocks)
    bm.free(table)

    off = BlockManager(16, BS, enable_prefix_caching=False)
    table = off.allocate(3)
    assert off.cache_full_blocks(table, tokens, 0) == 2
    assert not off.hash_to_block
    off.free(table)
    assert off.match_prefix(tokens) == ([], 0)
    assert (off.prefix_cache_queries, off.prefix_cache_hits) == (11, 0)
    off.check_integrity()


def test_check_integrity_catches_corruption():
    bm = BlockManager(4, BS)
    a = bm.allocate(2)
    bm.ref_counts[a[0]] = 0  # a used block loses its reference without being freed
    with pytest.raises(AssertionError, match="free"):
        bm.check_integrity()
    bm = BlockManager(4, BS)
    table = _run(bm, _seq(1, 2))
    bm.block_hash[table[0]] = 12345
    with pytest.raises(AssertionError, match="stale"):
        bm.check_integrity()


def test_random_ops_keep_integrity_and_never_hit_wrong_content():
    rng = random.Random(1234)
    bm = BlockManager(40, BS)
    # what each block's KV "holds": the token prefix up to the block's end (KV depends on it)
    content: dict[int, tuple[int, ...]] = {}
    live: list[dict] = []  # requests: tokens, table, num_hashed
    num_evicted = num_refused = 0
    prefixes = [[rng.randrange(3) for _ in range(rng.randrange(4, 14))] for _ in range(6)]

    def allocate(need: int) -> list[int] | None:
        nonlocal num_evicted, num_refused
        if not bm.can_allocate(need):
            num_refused += 1
            return None
        num_evicted += sum(bm.block_hash[b] is not None for b in list(bm.free_blocks)[:need])
        return bm.allocate(need)

    def write(req: dict, start: int) -> None:
        toks = req["tokens"]
        for i in range(start // BS, -(-len(toks) // BS)):
            content[req["table"][i]] = tuple(toks[: (i + 1) * BS])
        req["num_hashed"] = bm.cache_full_blocks(req["table"], toks, req["num_hashed"])

    for step in range(3000):
        op = rng.random()
        if op < 0.35 or not live:  # admit
            tokens = rng.choice(prefixes) + [rng.randrange(3) for _ in range(rng.randrange(8))]
            if not tokens:
                continue
            blocks, n = bm.match_prefix(tokens)
            for i, blk in enumerate(blocks):
                assert content[blk] == tuple(tokens[: (i + 1) * BS]), "prefix hit on wrong KV"
            new = allocate(-(-len(tokens) // BS) - len(blocks))
            if new is None:
                bm.free(blocks)
                continue
            req = {"tokens": tokens, "table": blocks + new, "num_hashed": len(blocks)}
            write(req, n)
            live.append(req)
        elif op < 0.65:  # decode a few tokens
            req = rng.choice(live)
            start = len(req["tokens"])
            req["tokens"] = req["tokens"] + [rng.randrange(3) for _ in range(rng.randrange(1, 6))]
            new = allocate(-(-len(req["tokens"]) // BS) - len(req["table"]))
            if new is None:
                req["tokens"] = req["tokens"][:start]
                continue
            req["table"] += new
            write(req, start)
        else:  # finish
            req = live.pop(rng.randrange(len(live)))
            bm.free(req["table"])
        bm.check_integrity()
        expected = [0] * bm.num_blocks
        for req in live:
            for blk in req["table"]:
                expected[blk] += 1
        assert bm.ref_counts == expected, f"step {step}"
    # the run exercised hits, misses, evictions of cached blocks and a full pool
    assert 500 < bm.prefix_cache_hits < bm.prefix_cache_queries
    assert num_evicted > 50 and num_refused > 10, (num_evicted, num_refused)
    for req in live:
        bm.free(req["table"])
    assert bm.num_free_blocks == bm.num_blocks
    bm.check_integrity()
