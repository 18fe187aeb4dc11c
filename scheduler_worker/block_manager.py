"""Paged-KV block allocator with prefix caching. Pure Python, no torch.

Every block is in exactly one of two sets:

    used:  ref_count >= 1, held by one or more requests (shared prefix blocks > 1)
    free:  ref_count == 0, in an LRU (OrderedDict, oldest first); a free block may still
           hold a hash, so a later request with the same prefix can take it back

A full block is identified by a chained hash of (parent block's hash, its token ids), so
a hit on block i implies the whole prefix up to block i matches; the stored tokens are
compared on a hit to rule out hash collisions. Allocation takes the least recently freed
block and drops its hash (eviction). A request frees its blocks tail first, so its head
blocks (the most shareable prefix) are evicted last.

Invariants (check_integrity): free + used == total; ref counts >= 0; free blocks have
ref 0; every hash map entry points at a block that holds that hash.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence


class NoFreeBlocksError(RuntimeError):
    pass


def chain_hash(parent: int | None, tokens: Sequence[int]) -> int:
    return hash((parent, tuple(tokens)))


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.ref_counts = [0] * num_blocks
        self.block_hash: list[int | None] = [None] * num_blocks
        self.block_tokens: list[tuple[int, ...] | None] = [None] * num_blocks
        self.hash_to_block: dict[int, int] = {}
        self.free_blocks: OrderedDict[int, None] = OrderedDict((b, None) for b in range(num_blocks))
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
        if n > len(self.free_blocks):
            raise NoFreeBlocksError(f"need {n} blocks, {len(self.free_blocks)} free")
        out = []
        for _ in range(n):
            block, _ = self.free_blocks.popitem(last=False)  # least recently freed
            self._drop_hash(block)
            self.ref_counts[block] = 1
            out.append(block)
        return out

    def _drop_hash(self, block: int) -> None:
        h = self.block_hash[block]
        if h is not None:
            if self.hash_to_block.get(h) == block:
                del self.hash_to_block[h]
            self.block_hash[block] = None
            self.block_tokens[block] = None

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
            tokens = tuple(token_ids[i * bs : (i + 1) * bs])
            h = chain_hash(parent, tokens)
            block = self.hash_to_block.get(h)
            if block is None or self.block_tokens[block] != tokens:
                break
            blocks.append(block)
            parent = h
        for block in blocks:
            if self.ref_counts[block] == 0:
                del self.free_blocks[block]
            self.ref_counts[block] += 1
        num_cached = len(blocks) * bs
        self.prefix_cache_hits += num_cached
        return blocks, num_cached

    def cache_full_blocks(self, block_ids: list[int], token_ids: Sequence[int],
                          num_hashed_blocks: int) -> int:
        """Register the full blocks past the first num_hashed_blocks (their KV is written).
        Returns the new number of hashed blocks."""
        num_full = min(len(token_ids) // self.block_size, len(block_ids))
        if not self.enable_prefix_caching or num_full <= num_hashed_blocks:
            return max(num_hashed_blocks, num_full)
        bs = self.block_size
        parent = self.block_hash[block_ids[num_hashed_blocks - 1]] if num_hashed_blocks else None
        for i in range(num_hashed_blocks, num_full):
            block = block_ids[i]
            tokens = tuple(token_ids[i * bs : (i + 1) * bs])
            h = chain_hash(parent, tokens)
            if self.block_hash[block] is None:
                # the block's chain hash is kept even when an identical block is already
                # registered (then only that one is in the map): the chain continues from it
                self.block_hash[block] = h
                self.block_tokens[block] = tokens
                self.hash_to_block.setdefault(h, block)
            parent = h
        return num_full

    def incref(self, block_ids: list[int]) -> None:
        for block in block_ids:
            if self.ref_counts[block] == 0:
                del self.free_blocks[block]
            self.ref_counts[block] += 1

    def free(self, block_ids: list[int]) -> None:
        for block in reversed(block_ids):  # tail first: evicted before the shared head
            if self.ref_counts[block] <= 0:
                raise RuntimeError(f"double free of block {block}")
            self.ref_counts[block] -= 1
            if self.ref_counts[block] == 0:
                self.free_blocks[block] = None

    def reset_prefix_cache(self) -> None:
        for block in self.free_blocks:
            self._drop_hash(block)

    def check_integrity(self) -> None:
        used = sum(1 for r in self.ref_counts if r > 0)
        assert used + len(self.free_blocks) == self.num_blocks, (
            f"free {len(self.free_blocks)} + used {used} != total {self.num_blocks}")
        assert all(r >= 0 for r in self.ref_counts), "negative ref count"
        assert all(self.ref_counts[b] == 0 for b in self.free_blocks), "free block with refs"
        for h, block in self.hash_to_block.items():
            assert self.block_hash[block] == h, f"hash map entry for block {block} is stale"
            assert self.block_tokens[block] is not None
