"""Paged-KV block allocator with prefix caching. Pure Python, no torch.

A request's blocks, as the scheduler sees them (block_size 4, 14 tokens so far):

    tokens:  [a b c d|e f g h|i j k l|m n . .]
    blocks:  [   7   |   3   |   9   |  12   ]   block_table (allocated)
              cached   cached  computed partial
             |<- match_prefix ->|     |
             |<-------- hashed ------>|          cache_full_blocks after the forward
                                       ^ partial block: never hashed, never shared

Every block is in exactly one of two states:

    used:  ref_count >= 1, in one or more block tables (shared prefix blocks have > 1)
    free:  ref_count == 0, in `free_blocks`, an OrderedDict whose front is evicted first.
           A free block may keep its hash, so a later request with the same prefix takes
           it back (match_prefix) in O(1) instead of recomputing it.

A full block is identified by a chained hash h_i = hash((h_{i-1}, tokens of block i)), so
a hit on block i stands for the whole prefix up to block i. On a hit the stored
(parent hash, tokens) are compared too, so a plain hash collision never hits; matching
stops at the first miss, so every returned block was checked against its own tokens.

Eviction order (`allocate` pops from the front of `free_blocks`):
    1. unhashed free blocks (nothing to lose) are put at the front when freed;
    2. hashed free blocks go to the back, least recently freed first; a request frees
       its blocks tail first, so its head blocks (the most shareable prefix) go last.
A block that is evicted (re-allocated) drops its hash.

Invariants (check_integrity):
    free + used == total; ref counts >= 0; a block is free iff its ref count is 0;
    hash_to_block[h] == b implies block_hash[b] == h;
    a free block with a hash is the one registered for that hash.
A used block may hold a hash that maps to another block (it was computed while an
identical block was already registered); it keeps the hash only so that its successors
chain from it, and drops it when freed.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

BlockKey = tuple[int | None, tuple[int, ...]]  # (parent hash, block tokens)


class NoFreeBlocksError(RuntimeError):
    pass


def chain_hash(parent: int | None, tokens: tuple[int, ...]) -> int:
    return hash((parent, tokens))


class BlockManager:
    def __init__(
        self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True
    ) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(
                f"need num_blocks >= 1 and block_size >= 1, got {num_blocks}, {block_size}"
            )
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.ref_counts = [0] * num_blocks
        self.block_hash: list[int | None] = [None] * num_blocks
        self.block_key: list[BlockKey | None] = [None] * num_blocks
        self.hash_to_block: dict[int, int] = {}
        self.free_blocks: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self.prefix_cache_queries = 0  # tokens looked up
        self.prefix_cache_hits = 0  # tokens found

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_blocks)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self.free_blocks)

    @property
    def usage(self) -> float:
        return self.num_used_blocks / self.num_blocks

    def can_allocate(self, n: int) -> bool:
        return n <= len(self.free_blocks)

    def allocate(self, n: int) -> list[int]:
        """n fresh blocks with ref count 1, evicting from the front of the free list."""
        if n > len(self.free_blocks):
            raise NoFreeBlocksError(f"need {n} blocks, {len(self.free_blocks)} free")
        out = []
        for _ in range(n):
            block, _ = self.free_blocks.popitem(last=False)
            self._drop_hash(block)
            self.ref_counts[block] = 1
            out.append(block)
        return out

    def match_prefix(self, token_ids: Sequence[int]) -> tuple[list[int], int]:
        """Take the longest run of cached full blocks that prefixes token_ids (ref +1 each).
        At least one token is always left uncached: the model must compute the last one."""
        self.prefix_cache_queries += len(token_ids)
        if not self.enable_prefix_caching:
            return [], 0
        bs = self.block_size
        blocks: list[int] = []
        parent: int | None = None
        for i in range((len(token_ids) - 1) // bs):
            key = (parent, tuple(token_ids[i * bs : (i + 1) * bs]))
            h = chain_hash(*key)
            block = self.hash_to_block.get(h)
            if block is None or self.block_key[block] != key:
                break
            blocks.append(block)
            parent = h
        self.incref(blocks)
        num_cached = len(blocks) * bs
        self.prefix_cache_hits += num_cached
        return blocks, num_cached

    def cache_full_blocks(
        self,
        block_ids: list[int],
        token_ids: Sequence[int],
        num_hashed_blocks: int,
        known: int | None = None,
    ) -> int:
        """Register the full blocks block_ids[num_hashed_blocks : known // block_size]
        (their KV is written) of token_ids' first `known` (default: all). Returns the new
        number of hashed blocks; with caching off, the number of full blocks (so the caller
        does not ask again for the same ones). `known` spares a caller the copy of a
        request's whole token list that a slice would take, a block at a time."""
        known = len(token_ids) if known is None else min(known, len(token_ids))
        num_full = min(known // self.block_size, len(block_ids))
        if not self.enable_prefix_caching or num_full <= num_hashed_blocks:
            return max(num_hashed_blocks, num_full)
        parent = self.block_hash[block_ids[num_hashed_blocks - 1]] if num_hashed_blocks else None
        if num_hashed_blocks and parent is None:
            return num_hashed_blocks  # chain broken (caller bug): never register a wrong chain
        bs = self.block_size
        for i in range(num_hashed_blocks, num_full):
            block = block_ids[i]
            key = (parent, tuple(token_ids[i * bs : (i + 1) * bs]))
            h = chain_hash(*key)
            if self.block_hash[block] is None:
                self.block_hash[block], self.block_key[block] = h, key
                self.hash_to_block.setdefault(h, block)  # an existing entry wins
            parent = h
        return num_full

    def incref(self, block_ids: Sequence[int]) -> None:
        for block in block_ids:
            if self.ref_counts[block] == 0:
                del self.free_blocks[block]  # O(1): taken back from the free list
            self.ref_counts[block] += 1

    def free(self, block_ids: Sequence[int]) -> None:
        """Drop one reference to each block; the last one puts it on the free list."""
        for block in block_ids:
            if self.ref_counts[block] <= 0:
                raise RuntimeError(f"double free of block {block}")
        for block in reversed(block_ids):  # tail first: evicted before the shared head
            if self.ref_counts[block] <= 0:
                raise RuntimeError(f"double free of block {block} (listed twice)")
            self.ref_counts[block] -= 1
            if self.ref_counts[block]:
                continue
            h = self.block_hash[block]
            owner = self.hash_to_block.get(h) if h is not None else None
            if h is not None and owner is None:
                self.hash_to_block[h] = block  # its twin was evicted: this copy takes over
            elif owner != block:
                self._drop_hash(block)  # unhashed, or a twin of a registered block
            self.free_blocks[block] = None
            if self.block_hash[block] is None:
                self.free_blocks.move_to_end(block, last=False)

    def _drop_hash(self, block: int) -> None:
        h = self.block_hash[block]
        if h is not None:
            if self.hash_to_block.get(h) == block:
                del self.hash_to_block[h]
            self.block_hash[block] = self.block_key[block] = None

    def check_integrity(self) -> None:
        refs, free = self.ref_counts, self.free_blocks
        assert len(refs) == self.num_blocks, f"{len(refs)} ref counts for {self.num_blocks} blocks"
        neg = [b for b, r in enumerate(refs) if r < 0]
        assert not neg, f"negative ref counts on blocks {neg[:8]}"
        bad = [b for b in free if not 0 <= b < self.num_blocks or refs[b] != 0]
        assert not bad, f"free blocks {bad[:8]} are out of range or referenced"
        used = sum(1 for r in refs if r > 0)
        assert used + len(free) == self.num_blocks, (
            f"free {len(free)} + used {used} != total {self.num_blocks}"
        )
        for h, block in self.hash_to_block.items():
            assert self.block_hash[block] == h, f"hash map entry for block {block} is stale"
            key = self.block_key[block]
            assert key is not None and len(key[1]) == self.block_size, f"block {block} key {key}"
            assert chain_hash(*key) == h, f"block {block}: hash does not match its tokens"
        for block in free:
            kept = self.block_hash[block]
            assert kept is None or self.hash_to_block.get(kept) == block, (
                f"free block {block} holds a hash that is registered elsewhere"
            )
        for block in range(self.num_blocks):
            assert (self.block_hash[block] is None) == (self.block_key[block] is None), (
                f"block {block}: hash and key out of step"
            )
